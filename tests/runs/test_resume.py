"""What a resume may change: honoured keys pass, keys that change a checkpoint's meaning do not."""

from __future__ import annotations

import pytest
import torch

from tandem.modules.grpo import warmup_factor
from tandem.runs import RunRefused
from tandem.runs.resume import changes, check_resume, honour_optimizer_config

OLD = {"batch_size": 8, "module": {"lr": 1e-3, "loss": {"clip_low": 0.2}}, "logger": [{"a": 1}]}


def test_changes_are_listed_by_dotted_key() -> None:
    module = {"lr": 5e-4, "loss": {"clip_low": 0.3}}
    new = {"batch_size": 16, "module": module, "logger": [], "x": 1}
    assert changes(OLD, new) == {
        "batch_size": (8, 16),
        "logger": ([{"a": 1}], []),
        "module.loss.clip_low": (0.2, 0.3),
        "module.lr": (1e-3, 5e-4),
        "x": ("<absent>", 1),
    }


def test_a_change_of_meaning_is_refused_naming_each_unless_allowed() -> None:
    diff = changes(OLD, {**OLD, "batch_size": 16, "seed": 3, "module": {**OLD["module"]}})
    with pytest.raises(RunRefused) as err:
        check_resume(diff, "refuse")
    assert "batch_size: 8 -> 16" in str(err.value) and "seed: '<absent>' -> 3" in str(err.value)
    assert "resume_changes=allow" in str(err.value)
    check_resume(diff, "allow")


def test_honoured_changes_pass() -> None:
    new = {**OLD, "module": {**OLD["module"], "lr": 1e-4}, "logger": []}
    check_resume(changes(OLD, new), "refuse")


def test_the_optimizer_state_takes_the_new_lr_and_weight_decay() -> None:
    ckpt = {
        "lr_schedulers": [{"last_epoch": 2, "base_lrs": [1e-3], "_last_lr": [6e-4]}],
        "optimizer_states": [
            {"param_groups": [{"lr": 6e-4, "initial_lr": 1e-3, "weight_decay": 0.0}]}
        ],
    }
    honour_optimizer_config(ckpt, 5e-4, 0.1, lambda s: warmup_factor(s, 5))
    (group,) = ckpt["optimizer_states"][0]["param_groups"]
    # after 2 scheduler steps of a 5-step warmup the lr is 3/5 of the new base
    assert group == {"lr": 5e-4 * 0.6, "initial_lr": 5e-4, "weight_decay": 0.1}
    assert ckpt["lr_schedulers"][0]["base_lrs"] == [5e-4]
    assert ckpt["lr_schedulers"][0]["_last_lr"] == [5e-4 * 0.6]


def test_an_optimizer_a_strategy_restored_takes_the_new_lr_too() -> None:
    # a distributed checkpoint's optimizer state is loaded from its shards, before the hook
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=6e-4, weight_decay=0.0)
    ckpt = {"lr_schedulers": [{"last_epoch": 2, "base_lrs": [1e-3], "_last_lr": [6e-4]}]}
    honour_optimizer_config(ckpt, 5e-4, 0.1, lambda s: warmup_factor(s, 5), [opt])
    (group,) = opt.param_groups
    assert group["lr"] == 5e-4 * 0.6 and group["initial_lr"] == 5e-4
    assert group["weight_decay"] == 0.1
