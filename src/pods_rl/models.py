"""Models and tokenizers: checking a model path before anything loads, and loading for training or generation.

    check_model_path(name)          a local model dir, a cached or reachable hub id; else one ValueError line
    load_for_training(model_args)   (model, tokenizer) as `pods train` loads them (default: the tiny model)
    load_model_and_tokenizer(path)  (model in eval mode, tokenizer) for generation; adapters merged
    check_remote_code(name, trust)  refuses a model shipping its own code unless ``--trust_remote_code``

Every load passes ``trust_remote_code`` as an explicit bool: with None transformers prompts on a terminal."""

from __future__ import annotations

import json
import os
import pickle
from contextlib import contextmanager
from pathlib import Path

from pods_rl import tiny
from pods_rl.runlog.evals import is_adapter_dir, is_model_dir  # noqa: F401  (is_adapter_dir: part of this API)


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a hub id (``org/name``)."""
    return (Path(name).expanduser().exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1
            or "\\" in name or ("/" in name and Path(name.split("/")[0]).is_dir()))


def check_model_path(name: str, revision: str | None = None, what: str = "--model_name_or_path") -> None:
    """One ValueError line, before anything loads, for a missing local model, an uncached hub id offline, or one the
    hub lacks or cannot be reached for (probed once, no retries). ``what`` names the flag."""
    path, label = Path(name).expanduser(), f"{what} {name}".strip()
    if looks_local(name):
        if not path.exists():
            raise ValueError(f"{label}: no such directory; pass a saved model directory or a "
                             "hub id like Qwen/Qwen2.5-3B-Instruct")
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ValueError(f"{label} holds no model (no config.json); pass a directory "
                             "written by save_pretrained (e.g. a run's final/) or a hub id")
        return
    # huggingface_hub loads in a fraction of a second, but only a hub id needs it.
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return  # cached: loads without the network
    if hub_offline():
        raise ValueError(f"{label}: no such local directory, and hub model {name!r} is not in the local hub "
                         f"cache and HF_HUB_OFFLINE=1: download it with network (hf download {name}) or pass a local "
                         "model directory")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(name, revision=revision, timeout=10)
    except GatedRepoError:
        raise ValueError(f"model {name!r} is gated on the hub: accept its terms on huggingface.co and log in "
                         "(hf auth login), or pass a local model directory") from None
    except RevisionNotFoundError:
        raise ValueError(f"model {name!r} has no revision {revision!r} on the hub") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{label}: no such local directory, and no model {name!r} on the hub (or it is "
                         "private: log in with hf auth login)") from None
    except Exception as err:  # noqa: BLE001 - connection refused, DNS, timeout, proxy: all mean "no hub"
        raise ValueError(f"{label}: no such local directory, and cannot reach the Hugging Face hub to get it "
                         f"({type(err).__name__}: "
                         f"{str(err).strip()[:120]}); when offline, set HF_HUB_OFFLINE=1 and use a cached model, "
                         "or pass a local model directory") from None


TRUST_FLAG = "--trust_remote_code"


def remote_code(name: str, revision: str | None = None) -> list[str] | None:
    """The ``.py`` modules a local or cached model's ``auto_map`` names when transformers does not know its
    ``model_type``; None when it needs none."""
    if looks_local(name):
        config_file = Path(name).expanduser() / "config.json"
        if not config_file.is_file():
            return None
    else:
        from huggingface_hub import try_to_load_from_cache

        config_file = try_to_load_from_cache(name, "config.json", revision=revision)
        if not isinstance(config_file, str):
            return None  # not cached: the loader asks the hub, and its refusal becomes the same line
    try:
        config = json.loads(Path(config_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable: the loader reports it
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not isinstance(auto_map, dict) or not auto_map:
        return None
    # transformers' own names (seconds to import; the model is about to load anyway)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if config.get("model_type") in CONFIG_MAPPING_NAMES:
        return None
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, (list, tuple)) else [v]) if r]
    return sorted({str(r).split("--")[-1].rsplit(".", 1)[0] + ".py" for r in refs})


def remote_code_refusal(name: str, detail: str = "") -> ValueError:
    """The one line that refuses to run a model's own code without ``--trust_remote_code true``."""
    return ValueError(f"model {name} ships its own Python code{detail}, which pods-rl runs only with "
                      f"{TRUST_FLAG} true: pass it if you trust where the model comes from (the code runs with your "
                      "permissions), or use a model transformers supports natively; nothing of it was run")


def check_remote_code(name: str, trust_remote_code: bool, revision: str | None = None) -> None:
    """Refuse (one ValueError line naming ``--trust_remote_code``), before anything loads, a model whose config
    names code of its own, unless ``trust_remote_code``. A PEFT adapter's base model is checked too."""
    if trust_remote_code:
        return
    found = remote_code(name, revision)
    if found is None and looks_local(name) and (Path(name).expanduser() / "adapter_config.json").is_file():
        try:
            base = adapter_base(Path(name).expanduser())
        except (ValueError, OSError):
            return
        found, name = remote_code(base), base
    if found is not None:
        raise remote_code_refusal(name, f" ({', '.join(found)}, named by auto_map in its config.json)")


def _refused_pickle(err: Exception, name: str) -> ValueError | None:
    """torch's weights-only refusal of a model file (a pickle that could run code) as one line naming the file,
    never torch's advice to load it unsafely; None for any other error."""
    if not (isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in str(err)):
        return None
    from pods_rl.runlog.integrity import load_problems  # reads the torch files of a local model directory

    path = Path(name).expanduser()
    named = load_problems(path) if path.is_dir() else []
    where = f"{path / named[0][0]} {named[0][1]}" if named else (
        f"model {name} holds a file with pickled Python objects, not only tensors: refused unread, since loading it "
        "could run code")
    return ValueError(f"{where}; use the model's .safetensors weights, or a copy from a source you trust")


@contextmanager
def _refusing(name: str):
    """Inside the block, transformers' refusal of a model's code (``trust_remote_code=False``) and torch's of a
    pickle become our one line (``remote_code_refusal``, ``_refused_pickle``); other errors pass unchanged."""
    try:
        yield
    except (ValueError, RuntimeError, pickle.UnpicklingError) as err:
        if isinstance(err, ValueError) and "trust_remote_code" in str(err):
            raise remote_code_refusal(name) from None
        refusal = _refused_pickle(err, name)
        if refusal is None:
            raise
        raise refusal from None


def load_config(name: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model's ``AutoConfig``; its own code runs only with ``trust_remote_code`` (else one ValueError line
    naming ``--trust_remote_code``; never a terminal prompt)."""
    from transformers import AutoConfig  # seconds to import; only where a config is read

    with _refusing(name):
        return AutoConfig.from_pretrained(name, revision=revision, trust_remote_code=bool(trust_remote_code))


def default_model_path(name: str | None) -> str:
    """``name``, or the shipped tiny model's directory when no model is named."""
    return name or str(tiny.model_path())


def load_for_training(model_args, trust_remote_code: bool = False):
    """(model, tokenizer) of a ``trl.ModelConfig`` for training (one ValueError line on failure; pad defaults: eos)."""
    # transformers takes seconds to import; checking a recipe does not need it.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = model_args.model_name_or_path
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    trust = bool(trust_remote_code)  # never None: transformers would ask on a terminal
    check_remote_code(model_path, trust, model_args.model_revision)
    try:
        with _refusing(model_path):
            tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision,
                                                      trust_remote_code=trust)
            model = AutoModelForCausalLM.from_pretrained(model_path, revision=model_args.model_revision,
                                                         dtype=dtype, trust_remote_code=trust)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = "" if hub_offline() or looks_local(model_path) else (
            "; without network, set HF_HUB_OFFLINE=1 and use a cached model or a local directory")
        raise ValueError(f"could not load model {model_path!r}: {first}{hint}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def has_tokenizer_files(path: Path) -> bool:
    """Whether the directory ``path`` holds a tokenizer of its own."""
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def adapter_base(path) -> str:
    """The ``base_model_name_or_path`` of the PEFT adapter in ``path``."""
    base_name = json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_name:
        raise ValueError(f"{path}/adapter_config.json names no base_model_name_or_path; cannot load it")
    return base_name


def tokenizer_source(path) -> str:
    """Where ``path``'s tokenizer loads from: ``path``, or the base model of an adapter without tokenizer files."""
    path = Path(path)
    if is_adapter_dir(path) and not has_tokenizer_files(path):
        return adapter_base(path)
    return str(path)


def load_model_and_tokenizer(path, device=None, trust_remote_code: bool = False):
    """(model in eval mode, tokenizer padding left) for generation from a model dir, adapter dir (merged) or hub id;
    bf16 on CUDA, fp32 on CPU."""
    # transformers takes seconds to import; `pods eval --help` does not need it.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    path_obj = Path(path)
    trust = bool(trust_remote_code)  # never None: transformers would ask on a terminal
    check_remote_code(str(path), trust)
    with _refusing(str(path)):
        if is_adapter_dir(path_obj):
            from peft import PeftModel  # optional dependency, only for adapters

            base_name = adapter_base(path_obj)
            model = AutoModelForCausalLM.from_pretrained(base_name, dtype=dtype, trust_remote_code=trust)
            model = PeftModel.from_pretrained(model, str(path_obj)).merge_and_unload()
        else:
            if path_obj.exists() and not (path_obj / "config.json").is_file():
                raise ValueError(f"{path_obj} has neither config.json nor adapter_config.json: not a model directory")
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(path_obj), trust_remote_code=trust)
    return model.to(device).eval(), tokenizer
