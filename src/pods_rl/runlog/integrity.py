"""Is a saved checkpoint readable? Cheap checks of its files before anything loads, so that a corrupt one is named
in one line (which file, what is wrong, which checkpoint to resume from instead) rather than failing minutes later
inside a library's loader.

What is checked (without reading tensor data; seconds for a 3B checkpoint at most):

- JSON files (``trainer_state.json``, ``config.json``, ``adapter_config.json``, tokenizer files...): parse;
- ``*.safetensors``: the header parses and the tensors it lists end exactly where the file ends (truncation);
- torch zip files (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``*.bin``): the zip directory at the
  end of the file reads (truncation; what a kill during ``torch.save`` leaves);
- a sharded model's ``*.index.json`` names shards that are there;
- an empty (0-byte) file of any of those kinds.

A bit flipped inside tensor data is not seen here; the loader's error is then reported with the same advice by
the caller (``pods_rl.train``).
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

JSON_SUFFIXES = (".json",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def _check_json(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError as err:
        return f"not valid JSON ({err})"
    return None


def _check_safetensors(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, no header)"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8 or header_len > 100_000_000:
            return f"truncated or not safetensors (header of {header_len} bytes in a file of {size})"
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return "its header is not valid JSON (not safetensors, or overwritten)"
    if not isinstance(header, dict):
        return "its header is not a mapping (not safetensors)"
    ends = [info["data_offsets"][1] for name, info in header.items()
            if name != "__metadata__" and isinstance(info, dict) and "data_offsets" in info]
    expected = 8 + header_len + (max(ends) if ends else 0)
    if expected != size:
        return (f"truncated ({size} bytes, its header lists {expected})" if size < expected
                else f"{size - expected} bytes longer than its header lists")
    return None


def _check_torch_zip(path: Path) -> str | None:
    if path.stat().st_size == 0:
        return "empty (0 bytes)"
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        return None  # a legacy (pickle) torch file: nothing cheap to check
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"truncated or damaged ({err})"
    return None


def check_file(path: str | os.PathLike) -> str | None:
    """What is wrong with one checkpoint file (a short phrase), or None if it looks readable."""
    path = Path(path)
    try:
        if path.stat().st_size == 0 and path.suffix in (*JSON_SUFFIXES, ".safetensors", *TORCH_SUFFIXES):
            return "empty (0 bytes)"
        if path.suffix in JSON_SUFFIXES:
            return _check_json(path)
        if path.suffix == ".safetensors":
            return _check_safetensors(path)
        if path.suffix in TORCH_SUFFIXES:
            return _check_torch_zip(path)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    return None


WEIGHT_PREFIXES = ("model", "pytorch_model", "adapter_model")  # model.safetensors, pytorch_model-00001-of-2.bin...
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def missing_weights(checkpoint: str | os.PathLike) -> tuple[str, str] | None:
    """``(file name, "missing ...")`` when a model directory (``config.json`` or ``adapter_config.json``) holds no
    weights file at all (a half-finished deletion or copy); None when it has one, or is not a model directory."""
    checkpoint = Path(checkpoint)
    adapter = (checkpoint / "adapter_config.json").is_file()
    if not (adapter or (checkpoint / "config.json").is_file()):
        return None
    for path in checkpoint.iterdir():
        if path.name.startswith(WEIGHT_PREFIXES) and path.name.endswith((*WEIGHT_SUFFIXES, ".index.json")):
            return None  # a sharded model's index: its shards are checked by checkpoint_problems
    name = "adapter_model.safetensors" if adapter else "model.safetensors"
    return name, "missing (no weights file of any kind in the checkpoint)"


def checkpoint_problems(checkpoint: str | os.PathLike) -> list[tuple[str, str]]:
    """``[(file name, what is wrong)]`` for the files of ``checkpoint`` that cannot be read, and a missing weights
    file; [] when all look fine."""
    checkpoint = Path(checkpoint)
    problems = [missing] if (missing := missing_weights(checkpoint)) else []
    for path in sorted(checkpoint.iterdir()):
        if not path.is_file():
            continue
        problem = check_file(path)
        if problem:
            problems.append((path.name, problem))
        elif path.name.endswith(".index.json"):
            try:
                shards = set(json.loads(path.read_text()).get("weight_map", {}).values())
            except (OSError, ValueError, AttributeError):
                shards = set()
            for shard in sorted(shards):
                if not (checkpoint / shard).is_file():
                    problems.append((shard, f"missing (listed in {path.name})"))
    return problems
