"""`pods SUB --help` tells the truth (#41): `pods train --help` lists --config and shows each field's own default,
naming the recipe's value where it differs; flags that mean the same across commands take the same spellings."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pods_rl import recipes
from pods_rl.commands import cli


def flag_texts(help_text: str) -> dict[str, str]:
    """{--flag: its help, whitespace collapsed} for every option of an argparse help text (each spelling a key)."""
    entries, current = {}, None
    for line in help_text.split("\n"):
        if re.match(r"^  -", line):
            names, _, text = line.strip().partition("  ")
            current = [n.split(" ")[0] for n in re.split(r", (?=-)", names)]
            for name in current:
                entries[name] = text.strip()
        elif current and line.startswith("    "):
            for name in current:
                entries[name] = f"{entries[name]} {line.strip()}".strip()
        else:
            current = None
    return entries


@pytest.fixture(scope="module")
def train_help() -> dict[str, str]:
    return flag_texts(recipes.train_help())


def test_pods_train_help_is_printed_by_the_parser_and_exits_0(capsys):
    with pytest.raises(SystemExit) as stop:
        recipes.parse_args(["--learning_rate", "1e-5", "--help"])
    assert stop.value.code == 0
    assert "--config RECIPE" in capsys.readouterr().out


def test_pods_train_help_lists_config_with_what_it_takes(train_help):
    text = train_help["--config"]
    assert "gsm8k/pods" in text and "tiny" in text and "YAML" in text, text
    assert all(name in text for name in recipes.packaged_recipes())


@pytest.mark.parametrize("flag, default, recipe", [
    ("--downsample_to", "None", "8"), ("--torch_threads", "None", "1"), ("--save_every_seconds", "None", "60"),
    ("--max_train_seconds", "None", "300"), ("--learning_rate", "1e-06", "0.0002"),
    ("--lr_scheduler_type", "linear", "constant"), ("--eval_k", "5", "4"), ("--use_cpu", "False", "True"),
])
def test_pods_train_help_shows_the_field_default_and_the_embedded_recipes_value(train_help, flag, default, recipe):
    assert train_help[flag].endswith(f"(default: {default}; the embedded recipe: {recipe})"), train_help[flag]


def test_a_value_the_recipe_leaves_as_the_default_shows_the_default_alone(train_help):
    assert train_help["--eval_num_problems"].endswith("(default: 200)")  # tiny.yaml sets 200, the field's own
    assert train_help["--stop_grace_seconds"].endswith("(default: 30.0)")  # tiny.yaml does not set it


def test_every_flag_says_its_default_once(train_help):
    """Each flag's text says "(default: " once, at its end: no second default (argparse's own) and no field text that
    contradicts it ("Default: num_generations" where the default is None)."""
    for flag, text in train_help.items():
        if flag not in ("-h", "--help", "--config") and not flag.startswith(("--no_", "--no-")):
            assert text.count("(default: ") == 1 and text.endswith(")"), (flag, text)
            assert "Default:" not in text, (flag, text)


def test_our_fields_show_their_dataclass_defaults(train_help):
    """RunArguments' fields and those PODSConfig adds to GRPOConfig: the default in the help is the field's own."""
    from trl import GRPOConfig

    from pods_rl.engines.trl.trainer import PODSConfig

    ours = [*dataclasses.fields(recipes.RunArguments),
            *(f for f in dataclasses.fields(PODSConfig) if f.name not in GRPOConfig.__dataclass_fields__)]
    assert {"downsample_to", "save_every_seconds", "torch_threads", "task"} <= {f.name for f in ours}
    for field in ours:
        text = train_help[f"--{field.name}"]
        assert re.search(rf"\(default: {re.escape(recipes.shown(field.default))}[;)]", text), (field.name, text)


def test_the_no_flags_of_true_booleans_say_what_they_do(train_help):
    assert train_help["--no_eval_before_after"] == ("Set eval_before_after to false (the same as --eval_before_after "
                                                    "false).")
    assert train_help["--eval_before_after"].endswith("(default: True)")


def test_the_help_of_a_named_recipe_names_it():
    text = flag_texts(recipes.train_help("gsm8k/pods"))
    assert text["--learning_rate"].endswith("(default: 1e-06; the recipe gsm8k/pods: 5e-06)"), text["--learning_rate"]
    with pytest.raises(ValueError, match="neither a file nor a packaged recipe"):
        recipes.train_help("no/such")


def test_pods_train_still_parses_with_config_in_its_parser():
    run, config, model_args = recipes.parse_args(["--config", "cpu/smoke", "--eval_k", "3"])
    assert run.eval_k == 3 and config.max_steps == 4 and config.downsample_to == 4
    with pytest.raises(ValueError, match=r"unknown flag --confg \(did you mean --config\?\)"):
        recipes.parse_args(["--confg", "tiny"])


# --- the same meaning, the same spelling across commands ------------------------------------------------------
def test_pods_study_takes_the_pods_train_spelling_of_its_flags():
    from pods_rl.commands.study import build_parser

    args, recipe = build_parser().parse_known_args(
        ["--eval_k", "3", "--max_steps", "7", "--pilot_generations", "8", "--downsample_to", "4", "--eval_every_steps",
         "2", "--eval_num_problems", "5", "--save_every_seconds", "9", "--prompts_per_step", "2", "--dry_run",
         "--learning_rate", "1e-4"])
    assert ((args.eval_k, args.updates, args.pilot, args.m, args.eval_every, args.eval_problems)
        == (3, 7, "8", "4", 2, 5))
    assert (args.checkpoint_every, args.prompts_per_step, args.dry_run) == (9.0, 2, True)
    assert recipe == ["--learning_rate", "1e-4"]  # a `pods train` flag: the recipe's


def test_pods_study_refuses_what_it_sets_in_either_spelling_and_its_help_says_so(tmp_path):
    from pods_rl.commands.study import build_parser
    from pods_rl.commands.study_plan import STUDY_FLAGS, make_plan

    for flag in ("--num_generations", "--num-generations", "--seed"):
        args, recipe = build_parser().parse_known_args(["--out", str(tmp_path / "st"), flag, "3"])
        with pytest.raises(ValueError, match=f"^{flag} is set by pods study for each run; use"):
            make_plan(args, recipe)
    epilog = " ".join(build_parser().format_help().split())
    assert all(flag in epilog for flag in STUDY_FLAGS), epilog
    assert "--max_train_seconds" in epilog and "--save_total_limit 1" in epilog


def test_pods_cost_takes_num_generations_as_its_n_and_says_what_it_sets():
    from pods_rl.commands.cost import build_parser

    args, recipe = build_parser().parse_known_args(["--num_generations", "16,32", "--downsample_to", "4"])
    assert args.n == "16,32" and recipe == ["--downsample_to", "4"]  # m: the recipe's downsample_to
    text = " ".join(build_parser().format_help().split())
    assert "--config RECIPE" in text and "--max_steps (--warmup + --steps)" in text and "(default 5)" in text


def test_pods_verl_args_takes_the_pods_train_and_study_spellings(capsys):
    canonical = ["--prompts", "32", "--n", "64", "--m", "16", "--dp", "8", "--mini-batch", "512", "--oversample", "2",
                 "--rule", "max_variance", "--tiebreak", "shorter", "--trainer-mode", "sync"]
    aliases = ["--prompts_per_step", "32", "--num_generations", "64", "--downsample_to", "16", "--dp", "8",
               "--mini_batch", "512", "--oversample_prompts", "2", "--downsample_rule", "max_variance",
               "--downsample_tiebreak", "shorter", "--trainer_mode", "sync"]
    assert cli.main(["verl-args", *canonical]) == 0
    first = capsys.readouterr()
    assert cli.main(["verl-args", *aliases]) == 0
    assert capsys.readouterr() == first and first.out.strip()


def test_hyphenated_flags_take_underscores_too():
    from pods_rl.commands.evaluate import build_parser

    args = build_parser().parse_args(["model", "--task", "arithmetic", "--max_new_tokens", "8", "--batch_size", "2",
                                      "--include_base"])
    assert (args.max_new_tokens, args.batch_size, args.include_base) == (8, 2, True)
