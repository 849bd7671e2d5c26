"""The `pods` command line: one module per sub-command (``cli.COMMANDS`` maps each to its module; `pods study`'s
parts are ``study_*.py``), on top of the library they call. Imports run one way: commands -> library (pods_rl.*) ->
core (downsample, advantages, ...); nothing outside this package imports a command (tests/test_layout.py).
"""
