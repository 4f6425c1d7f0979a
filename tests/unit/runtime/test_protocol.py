"""Unit tests for paddle_dist.runtime.protocol: what the launcher tells its ranks through the
environment (its config and overrides, the script hooks' directory and option)."""

import os

from paddle_dist.runtime import protocol

HOOKS = protocol.SCRIPT_HOOKS


def test_the_launchers_config_options_travel_through_the_environment():
    variables = protocol.launch_variables("/x/mlp.yaml", ["train.epochs=1", "train.api=hapi"])
    assert protocol.launch_options(variables) == ("/x/mlp.yaml", ["train.epochs=1", "train.api=hapi"])
    assert protocol.launch_options({}) == (None, [])
    assert protocol.launch_options({protocol.LAUNCH_OVERRIDES: "not json"}) == (None, [])


def test_script_hooks_put_the_directory_first_once_and_pass_the_option():
    given = {"PYTHONPATH": os.pathsep.join([HOOKS, "/mine"])}
    assert protocol.script_hooks(False, given) == {"PYTHONPATH": os.pathsep.join([HOOKS, "/mine"])}
    assert protocol.script_hooks(True, {}) == {"PYTHONPATH": HOOKS, protocol.SYNC_BUFFERS: "1"}
    assert protocol.sync_buffers({protocol.SYNC_BUFFERS: "1"}) and not protocol.sync_buffers({})
