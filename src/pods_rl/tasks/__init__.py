"""Task registry: ``get_task(name, **kwargs) -> Task``. Built-in names: ``gsm8k``, ``math``, ``math500``,
``amc23``, ``arithmetic``, ``jsonl:<path>``, ``reasoning_gym:<dataset_name>``; imported lazily, only when asked."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable

from pods_rl.tasks.base import SYSTEM_PROMPT, Task

# name -> "module:attribute" (imported on first use) or a factory callable registered at runtime.
_REGISTRY: dict[str, str | Callable[..., Task]] = {
    "gsm8k": "pods_rl.tasks.gsm8k:GSM8KTask",
    "math": "pods_rl.tasks.math_tasks:MATHTask",
    "math500": "pods_rl.tasks.math_tasks:MATH500Task",
    "amc23": "pods_rl.tasks.math_tasks:AMC23Task",
    "arithmetic": "pods_rl.tasks.arithmetic:ArithmeticTask",
}
# "prefix:<argument>" names -> (factory, the keyword argument that receives <argument>).
_PREFIXES: dict[str, tuple[str, str]] = {
    "jsonl": ("pods_rl.tasks.jsonl:JSONLTask", "path"),
    "reasoning_gym": ("pods_rl.tasks.reasoning_gym:ReasoningGymTask", "dataset_name"),
}


def _resolve(target: str | Callable[..., Task]) -> Callable[..., Task]:
    if callable(target):
        return target
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def available_tasks() -> list[str]:
    """Names ``get_task`` accepts (prefixed families shown as ``"jsonl:<path>"`` etc.)."""
    return sorted(_REGISTRY) + [f"{prefix}:<{keyword}>" for prefix, (_, keyword) in sorted(_PREFIXES.items())]


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Register ``factory(**kwargs) -> Task`` under ``name`` (overrides an existing entry)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"task name must be a non-empty str without ':', got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory for task {name!r} must be callable, got {type(factory).__name__}")
    _REGISTRY[name] = factory


# A comma starts a new item only when ``key=`` follows it, so values may hold commas (``ops=+,-``).
_ITEM_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_.-]*\s*=)")


def parse_task_args(items: str | list[str] | tuple[str, ...] | None) -> dict:
    """Task options as given on any command line -> keyword arguments for ``get_task``.

    ``items``: one ``"key=value,key=value"`` string (``--task_args``) or a list of them (``--task-arg``). Values are
    read as JSON when they parse (``3`` a number, ``"3"`` a string), else kept as text. Later keys win."""
    if items is None:
        return {}
    out = {}
    for text in [items] if isinstance(items, str) else list(items):
        for item in _ITEM_SPLIT.split(text):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"task argument {item!r} is not key=value (e.g. --task-arg data_dir=data/gsm8k or "
                                 "--task_args 'data_dir=data/gsm8k,prompt_style=instruct')")
            try:
                out[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                out[key.strip()] = value.strip()
    return out


def get_task(name: str, **kwargs) -> Task:
    """Build the task called ``name``; the keyword arguments that apply (``data_dir``, ``seed``...) depend on it."""
    if not isinstance(name, str):
        raise ValueError(f"task name must be a str, got {type(name).__name__}")
    if name in _REGISTRY:
        return _build(name, _resolve(_REGISTRY[name]), kwargs)
    prefix, sep, argument = name.partition(":")
    if sep and prefix in _PREFIXES:
        if not argument:
            raise ValueError(f"task {name!r} needs an argument after ':', e.g. {available_tasks()}")
        target, keyword = _PREFIXES[prefix]
        if keyword in kwargs:
            raise ValueError(f"task {name!r} already names its {keyword}; don't also pass {keyword}=")
        return _build(name, _resolve(target), {keyword: argument, **kwargs})
    raise ValueError(f"unknown task {name!r}; available tasks: {available_tasks()}")


def _check_types(name: str, factory, kwargs: dict) -> None:
    """A ValueError for a keyword whose value has the wrong type for a dataclass task's field (``size=abc``)."""
    if not dataclasses.is_dataclass(factory):
        return
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # noqa: BLE001 - unresolvable annotations: leave the check to the task
        return
    simple = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
    for key, value in kwargs.items():
        hint = hints.get(key)
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if value is None and type(None) in options:
            continue
        accepted = [simple[t] for t in options if t in simple]
        if len(accepted) != len(options):  # a container or class type: not checked here
            continue
        ok = any(isinstance(value, a) and not (isinstance(value, bool) and bool not in a) for a in accepted)
        if not ok:
            wanted = " or ".join(t.__name__ for t in options if t is not type(None))
            raise ValueError(f"task {name!r}: {key}={value!r} must be {wanted}, got {type(value).__name__}"
                             "; fix it in task_args (values are read as JSON: 3 is a number, \"3\" a string)")


def _build(name: str, factory: Callable[..., Task], kwargs: dict) -> Task:
    """``factory(**kwargs)``, turning a wrong keyword into a ValueError that lists the accepted ones."""
    _check_types(name, factory, kwargs)
    try:
        return factory(**kwargs)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        try:
            accepted = sorted(p for p in inspect.signature(factory).parameters if p not in ("self", "kwargs"))
        except (TypeError, ValueError):
            accepted = "see the task's docstring"
        raise ValueError(f"task {name!r} got an unknown argument ({err}); accepted: {accepted}") from err


__all__ = ["SYSTEM_PROMPT", "Task", "available_tasks", "get_task", "register_task"]
