"""The `pods` command line: one module per sub-command, on top of the library they call.

    cli.py            dispatch (`pods <sub-command>`), the console script's entry point
    train.py          pods train            evaluate.py   pods eval         plots.py   pods plot, pods compare
    cost.py           pods cost             study.py      pods study (+ study_runner.py, study_report.py)
    launch.py         pods accelerate-config                build_tiny.py pods build-tiny
    verl_args.py      pods verl-args

Imports run one way: commands -> library (pods_rl.*) -> core (downsample, advantages, ...); nothing outside this
package imports a command (tests/test_layout.py).
"""
