"""Integrations with other engines: one module per engine, each the only one that knows that engine's internals.

Nothing here is imported by ``import pods_rl``; each module needs its engine's optional extra.
"""
