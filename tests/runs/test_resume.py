"""What a resume may change: honoured keys pass, keys that change a checkpoint's meaning do not."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from tandem.runs import RunRefused
from tandem.runs.resume import changes, check_resume, honour_optimizer_config, start_config

OLD = {
    "batch_size": 8,
    "module": {"optimizer": {"lr": 1e-3}, "loss": {"clip_low": 0.2}},
    "logger": [{"a": 1}],
}


def test_changes_are_listed_by_dotted_key() -> None:
    module = {"optimizer": {"lr": 5e-4}, "loss": {"clip_low": 0.3}}
    new = {"batch_size": 16, "module": module, "logger": [], "x": 1}
    assert changes(OLD, new) == {
        "batch_size": (8, 16),
        "logger": ([{"a": 1}], []),
        "module.loss.clip_low": (0.2, 0.3),
        "module.optimizer.lr": (1e-3, 5e-4),
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
    new = {**OLD, "module": {**OLD["module"], "optimizer": {"lr": 1e-4}}, "logger": []}
    check_resume(changes(OLD, new), "refuse")


def test_the_optimizer_state_takes_the_new_lr_and_weight_decay() -> None:
    ckpt = {
        "lr_schedulers": [{"last_epoch": 2, "base_lrs": [1e-3], "_last_lr": [6e-4]}],
        "optimizer_states": [
            {"param_groups": [{"lr": 6e-4, "initial_lr": 1e-3, "weight_decay": 0.0}]}
        ],
    }
    optimizer = partial(torch.optim.AdamW, lr=5e-4, weight_decay=0.1)
    # a 5-step linear warmup: lr x 0.2, 0.4, 0.6, ...
    warmup = partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.2, total_iters=4)
    honour_optimizer_config(ckpt, optimizer, warmup)
    (group,) = ckpt["optimizer_states"][0]["param_groups"]
    # after 2 scheduler steps the lr is 3/5 of the new base
    assert group == pytest.approx({"lr": 5e-4 * 0.6, "initial_lr": 5e-4, "weight_decay": 0.1})
    assert ckpt["lr_schedulers"][0]["base_lrs"] == [5e-4]
    assert ckpt["lr_schedulers"][0]["_last_lr"] == pytest.approx([5e-4 * 0.6])


def test_without_a_scheduler_the_lr_is_the_optimizer_s() -> None:
    ckpt = {"optimizer_states": [{"param_groups": [{"lr": 1e-3, "weight_decay": 0.0}]}]}
    honour_optimizer_config(ckpt, partial(torch.optim.AdamW, lr=2e-6, weight_decay=0.01), None)
    assert ckpt["optimizer_states"][0]["param_groups"] == [{"lr": 2e-6, "weight_decay": 0.01}]


def test_a_change_is_reported_once_not_again_where_it_is_interpolated() -> None:
    cfg = OmegaConf.create({"sampler": {"p": 0.5}, "module": {"sampler": "${sampler}"}})
    old = start_config(cfg)
    cfg.sampler.p = 0.3
    assert changes(old, start_config(cfg)) == {"sampler.p": (0.5, 0.3)}


def test_an_optimizer_a_strategy_restored_takes_the_new_lr_too() -> None:
    # a distributed checkpoint's optimizer state is loaded from its shards, before the hook
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=6e-4, weight_decay=0.0)
    ckpt = {"lr_schedulers": [{"last_epoch": 2, "base_lrs": [1e-3], "_last_lr": [6e-4]}]}
    optimizer = partial(torch.optim.AdamW, lr=5e-4, weight_decay=0.1)
    warmup = partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.2, total_iters=4)
    honour_optimizer_config(ckpt, optimizer, warmup, [opt])
    (group,) = opt.param_groups
    assert group["lr"] == pytest.approx(5e-4 * 0.6) and group["initial_lr"] == 5e-4
    assert group["weight_decay"] == 0.1
