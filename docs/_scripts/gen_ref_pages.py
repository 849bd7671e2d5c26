"""Generate the API reference: one page per public module of src/pods_rl, found by walking the package.

Run by mkdocs-gen-files at build time (nothing is written to docs/). A module is public when no part of its
dotted path starts with an underscore (``__init__`` stands for its package). Pages are read statically by
mkdocstrings/griffe, so building them imports nothing of pods_rl.
"""

from pathlib import Path

import mkdocs_gen_files

package_root = Path(__file__).resolve().parents[2] / "src"
nav = mkdocs_gen_files.Nav()

for path in sorted((package_root / "pods_rl").rglob("*.py")):
    parts = path.relative_to(package_root).with_suffix("").parts  # e.g. ("pods_rl", "runlog", "store")
    if parts[-1] == "__init__":
        parts = parts[:-1]
        doc_path = Path(*parts, "index.md")
    elif parts[-1] == "__main__":
        continue
    else:
        doc_path = Path(*parts).with_suffix(".md")
    if any(part.startswith("_") for part in parts):
        continue  # private module or package
    nav[parts] = doc_path.as_posix()
    with mkdocs_gen_files.open(Path("reference", doc_path), "w") as page:
        page.write(f"::: {'.'.join(parts)}\n")
    mkdocs_gen_files.set_edit_path(Path("reference", doc_path), path.relative_to(package_root.parent))

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as summary:
    summary.writelines(nav.build_literate_nav())
