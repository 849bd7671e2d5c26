"""Is a saved checkpoint readable? Cheap checks of its files before anything loads, so that a corrupt one is named
in one line (which file, what is wrong, which checkpoint to resume from instead).

Cheap checks (no tensor data): JSON files parse; ``*.safetensors`` headers parse and their tensors end where the
file ends; torch zip files (``optimizer.pt``, ``*.bin``...) have a readable zip directory; a sharded model's index
names shards that exist; no empty files. ``load_problems`` reads the tensors of the one checkpoint a resume loads:
torch files must load with ``weights_only=True`` (a pickle that would run code is refused unread) and the weights
must be finite. ``check_resume_checkpoint`` runs both."""

from __future__ import annotations

import json
import os
import struct
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

from pods_rl.runlog.store import list_checkpoints, read_clock

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
    """``(file name, "missing ...")`` when a model directory holds no weights file; else None."""
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
    """``[(file name, what is wrong)]`` for ``checkpoint``'s unreadable files or missing weights."""
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


# --- deep checks: reading the tensors --------------------------------------------------------------------------
# Files a resume never loads: the Trainer's pickled TrainingArguments (written for the record, read by no loader).
NOT_LOADED = ("training_args.bin",)


def _unsafe_globals(err: BaseException) -> str:
    """The pickled globals torch's weights-only unpickler refused (``GLOBAL posix.system`` -> ``posix.system``)."""
    import re

    names = re.findall(r"GLOBAL ([\w.]+)", str(err))
    return f" ({', '.join(dict.fromkeys(names))})" if names else ""


def _check_weights_only(path: Path) -> str | None:
    """Whether a torch file loads with ``weights_only=True`` (the unpickler that runs no code), with the numpy types
    transformers allows for its RNG state; the refusal's own advice (to load it unsafely) is never repeated."""
    import pickle

    import torch

    try:  # the allowlist (numpy types) transformers loads rng_state with
        from transformers.trainer_pt_utils import safe_globals
    except ImportError:  # pragma: no cover - transformers is a dependency
        from contextlib import nullcontext as safe_globals
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    try:
        with safe_globals(), warnings.catch_warnings():
            # a plain pickle makes torch warn of its protocol before refusing it: the refusal below says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)  # mmap: tensor data is not read
    except pickle.UnpicklingError as err:
        if "Unsupported global" in str(err):
            return (f"holds pickled Python objects{_unsafe_globals(err)}, not only tensors: refused unread, since "
                    "loading it could run code")
        return ("is not a weights-only torch file (damaged, or a pickle of Python objects): refused unread, since "
                "loading it could run code")
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        first = str(err).strip().splitlines()[0][:100] if str(err).strip() else type(err).__name__
        if "weights_only" in str(err) or "Weights only" in str(err):  # never quote torch's advice to load unsafely
            return "is not a weights-only torch file: refused unread, since loading it could run code"
        return f"cannot be read ({first})"
    return None


def _check_finite_safetensors(path: Path) -> str | None:
    """Whether every floating tensor of a safetensors file is finite (one tensor in memory at a time)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        for key in f.keys():
            tensor = f.get_tensor(key)
            if tensor.is_floating_point() and tensor.numel() and not bool(
                    torch.isfinite(torch.stack(torch.aminmax(tensor))).all()):  # NaN and inf reach min or max
                kind = "NaN" if bool(torch.isnan(tensor).any()) else "an infinity"
                return (f"holds non-finite weights ({kind} in {key}): the run had diverged when it was saved "
                        "(a version before the divergence guard wrote it)")
    return None


def load_problems(checkpoint: str | os.PathLike) -> list[tuple[str, str]]:
    """``[(file name, what is wrong)]`` found by reading ``checkpoint``'s tensors as a resume would: torch
    files that are not weights-only (never loaded) and safetensors holding NaN or an infinity."""
    checkpoint = Path(checkpoint)
    problems = []
    for path in sorted(checkpoint.iterdir()):
        if not path.is_file() or path.name in NOT_LOADED or check_file(path) is not None:
            continue
        try:
            if path.suffix in TORCH_SUFFIXES:
                problem = _check_weights_only(path)
            elif path.suffix == ".safetensors":
                problem = _check_finite_safetensors(path)
            else:
                continue
        except Exception as err:  # noqa: BLE001 - any reader failure is a file that cannot be loaded
            problem = f"cannot be read ({type(err).__name__}: {str(err).strip()[:100]})"
        if problem:
            problems.append((path.name, problem))
    return problems


# --- the checkpoint a resume loads ---------------------------------------------------------------------------
def check_resume_checkpoint(run_dir: Path, explicit: Path | None) -> None:
    """The checkpoint a resume would load (``explicit``, else the newest complete one) must pass
    the cheap checks and ``load_problems``; otherwise one line names the file, what is wrong, and the
    ``--resume_from_checkpoint`` of the newest earlier checkpoint that passes."""
    complete = list_checkpoints(run_dir)
    target = explicit or (complete[-1] if complete else None)
    if target is None:
        return
    cheap = checkpoint_problems(target)
    problems = cheap or load_problems(target)
    if not problems:
        return
    name, problem = problems[0]
    more = f" (and {len(problems) - 1} more of its files)" if len(problems) > 1 else ""
    intact = intact_before(run_dir, target)
    lower = " with a lower --learning_rate (and --accept_config_changes true)" if "non-finite" in problem else ""
    way_on = (f"resume from the last intact one: --resume_from_checkpoint {intact}{lower}" if intact else
              "no earlier checkpoint is intact: restore the file, or start a new run in another --output_dir")
    what = f"is corrupt: {problem}" if cheap else problem
    raise ValueError(f"{target}/{name} {what}{more}; {way_on} (nothing was changed)")


def intact_before(run_dir: Path, checkpoint: Path) -> Path | None:
    """The newest complete checkpoint before ``checkpoint`` that passes every check, or None."""
    clock = read_clock(checkpoint)
    step = clock["step"] if clock else float("inf")
    earlier = [c for c in list_checkpoints(run_dir)
               if c.name != checkpoint.name and read_clock(c)["step"] < step and not checkpoint_problems(c)]
    return next((c for c in reversed(earlier) if not load_problems(c)), None)


def loader_error(err: BaseException) -> str:
    """A loader error's first line, without torch's advice to load a refused file unsafely."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if "weights_only" in str(err) or "Weights only load failed" in str(err):
        return "a file holds pickled Python objects, not only tensors: refused unread, since loading it could run code"
    return first[:160]


class CheckpointUnreadable(ValueError):
    """A checkpoint could not be read back while training resumed from it (raised ``from`` the
    loader's error by ``reading_checkpoint``), so callers tell it by type."""

    def __init__(self, checkpoint, cause: BaseException):
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        super().__init__(f"{checkpoint} cannot be loaded ({type(cause).__name__}: {loader_error(cause)})")


@contextmanager
def reading_checkpoint(checkpoint):
    """Inside the block a checkpoint is being read: any error becomes ``CheckpointUnreadable(checkpoint)`` (chained
    to it). A stop request (``BaseException`` that is not an ``Exception``) passes through unchanged."""
    try:
        yield
    except CheckpointUnreadable:
        raise
    except Exception as err:
        raise CheckpointUnreadable(checkpoint, err) from err

