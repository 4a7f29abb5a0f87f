"""FSDP2 on 2 CPU processes (gloo), without Lightning: the tiny senior sharded per decoder layer
generates the unsharded model's very tokens, gathering its parameters once per rollout (not per
token) or layer by layer with the ranks in lockstep, and gathers back into the unsharded weights
for export and vLLM weight syncs."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from tandem.assets import TINY_WORLD
from tandem.engine import SamplingParams, generate
from tandem.engine.vllm_backend import VLLMBackend
from tandem.modules.sharding import full_state_dict, gathered, is_sharded, shard

WORLD = 2
TOKENS = 12


def _tiny() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)


def _generate(model: torch.nn.Module) -> torch.Tensor:
    params = SamplingParams(temperature=1.0, max_new_tokens=TOKENS, seed=3, eos_token_ids=())
    return generate(model, None, [[5, 6, 7], [8, 9]], None, params).tokens  # [2, TOKENS]


def _count_all_gathers(monkeypatch_target: list[int]):
    """Wrap the collective FSDP2 gathers parameters with, counting its calls."""
    real = dist.all_gather_single

    def counted(*args, **kwargs):
        monkeypatch_target[0] += 1
        return real(*args, **kwargs)

    dist.all_gather_single = counted
    return real


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole gradients of one training forward and backward."""
    model.train()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()}


class _Engine:
    """What the vLLM backend's weight sync calls on its engine, recording the weights."""

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.weights = {name: t.clone() for name, t in kwargs["weights_iterator"]}

    def reset_prefix_cache(self) -> None:
        pass


def _synced_to_vllm(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights ``VLLMBackend.sync`` hands its engine for a sharded senior (the engine faked:
    vLLM itself is not installed here)."""
    backend = VLLMBackend.__new__(VLLMBackend)
    backend.senior, backend.junior, backend.sync_every, backend.weights_step = (
        _Engine(),
        None,
        1,
        -1,
    )
    backend.sync(model, step=0)
    assert backend.weights_step == 0
    return backend.senior.weights


def _worker(rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard(_tiny(), mesh)
    units = sum(1 for m in model.modules() if is_sharded(m))
    calls = [0]
    real = _count_all_gathers(calls)
    try:
        with gathered(model):
            inside = _generate(model)
        per_rollout = calls[0]
        calls[0] = 0
        _generate(model)  # no gathering context: every forward gathers every unit again
        per_token = calls[0]
    finally:
        dist.all_gather_single = real
    plain, checkpointed = (shard(_tiny(), mesh, activation_checkpointing=ac) for ac in (0, 1))
    grads = [_grads(plain), _grads(checkpointed)]
    full = full_state_dict(model)
    pieces = _synced_to_vllm(model)
    base = _tiny().state_dict()
    result = {
        "units": units,
        "per_rollout": per_rollout,
        "per_token": per_token,
        "tokens": inside.tolist(),
        "sharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
        "full_keys": sorted(full),
        "full_equal": all(torch.equal(full[k], base[k]) for k in full),
        "synced_keys": sorted(pieces),
        "synced_equal": all(torch.equal(pieces[k], base[k]) for k in pieces),
        "checkpointing": [plain.is_gradient_checkpointing, checkpointed.is_gradient_checkpointing],
        "checkpointed_grads_equal": grads[0].keys() == grads[1].keys()
        and all(torch.allclose(grads[0][k], grads[1][k], atol=1e-6) for k in grads[0]),
    }
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_sharded_senior_generates_exports_and_syncs_whole(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    base = _tiny()
    layers = base.config.num_hidden_layers
    assert r0["sharded"] and r1["sharded"], "every parameter a DTensor shard"
    assert r0["units"] == layers + 1, "one unit per decoder layer and the root"
    # once per unit for the whole rollout, however many tokens it has
    assert r0["per_rollout"] == r0["units"]
    assert r0["per_token"] >= TOKENS * layers, "the counter sees per-forward gathers"
    assert r0["tokens"] == _generate(base).tolist() == r1["tokens"]
    # rank 0 holds the whole state dict (others none), the tied head once, as HF saves it;
    # every rank's vLLM engine gets every tensor whole
    assert set(base.state_dict()) - set(r0["full_keys"]) == {"lm_head.weight"}
    assert base.config.tie_word_embeddings and r1["full_keys"] == []
    assert r0["full_equal"] and r0["synced_equal"] and r1["synced_equal"]
    assert r0["synced_keys"] == r1["synced_keys"] == sorted(base.state_dict())
    # recomputing activations in backward changes no gradient
    assert r0["checkpointing"] == [False, True]
    assert r0["checkpointed_grads_equal"] and r1["checkpointed_grads_equal"]


def test_shard_refuses_layers_that_match_nothing() -> None:
    with pytest.raises(ValueError, match=r"strategy.layers \(\['Nope'\]\) matches no module"):
        shard(_tiny(), mesh=None, layers=["Nope"])


# per_layer: rank 0's prompts fill two prefill chunks of at most _CHUNK padded tokens and stop
# within 10 to 15 tokens (the context limit), rank 1's one prompt fills one and runs to the end
_CHUNK, _LIMIT, _LONG = 100, 60, 20
_PROMPTS = [[list(range(5, 5 + w)) for w in (45, 47, 49, 50)], [[5, 6, 7, 8, 9]]]


def _lockstep_params() -> SamplingParams:
    return SamplingParams(
        temperature=1.0,
        max_new_tokens=_LONG,
        seed=5,
        eos_token_ids=(),
        samples_per_prompt=2,
        context_limit=_LIMIT,
    )


def _lockstep_worker(rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    # a rank left waiting in a collective fails the test in a minute instead of hanging it
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/pg",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    from torch.distributed.device_mesh import init_device_mesh

    from tandem.engine import reader

    reader._PREFILL_TOKENS["cpu"] = _CHUNK
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard(_tiny(), mesh)
    calls = [0]
    real = _count_all_gathers(calls)
    try:
        with gathered(model, "per_layer") as lockstep:
            out = generate(model, None, _PROMPTS[rank], None, _lockstep_params(), lockstep=lockstep)
    finally:
        dist.all_gather_single = real
    # training after such a rollout: the same gradients as a senior that never generated
    grads = [_grads(model), _grads(shard(_tiny(), mesh))]
    result = {
        "all_gathers": calls[0],
        "grads_equal": all(torch.equal(grads[0][k], grads[1][k]) for k in grads[1]),
        "tokens": out.tokens.tolist(),
        "logprobs": out.senior_logprobs.tolist(),
        "lengths": out.lengths.tolist(),
        "resharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
    }
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_per_layer_rollouts_keep_the_ranks_in_lockstep(tmp_path: Path, monkeypatch) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    mp.spawn(_lockstep_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    from tandem.engine import reader

    monkeypatch.setitem(reader._PREFILL_TOKENS, "cpu", _CHUNK)
    base = _tiny()
    for rank, got in enumerate(ranks):
        want = generate(base, None, _PROMPTS[rank], None, _lockstep_params())
        assert got["tokens"] == want.tokens.tolist(), f"rank {rank}: the unsharded tokens"
        torch.testing.assert_close(torch.tensor(got["logprobs"]), want.senior_logprobs)
        assert got["resharded"], "every parameter a shard again after the rollout"
        assert got["grads_equal"], "the senior trains after a per-layer rollout"
    # the ranks finish at different steps: rank 0 after 15 tokens, rank 1 after all 20
    assert max(ranks[0]["lengths"]) == _LIMIT - 45 and set(ranks[1]["lengths"]) == {_LONG}
    # both make the same forwards: 2 prefill chunks and 19 steps, each gathering every layer;
    # every unit is gathered once more on entry (the root kept for the rollout)
    layers = base.config.num_hidden_layers
    forwards = 2 + _LONG - 1
    assert ranks[0]["all_gathers"] == ranks[1]["all_gathers"] == 1 + layers * (1 + forwards)


def _update_batch(vocab: int, rank: int):
    """A mini-batch of 6 random rows of uneven lengths, each rank its own."""
    from tandem.modules.update import UpdateBatch

    g = torch.Generator().manual_seed(rank)
    n, p, t = 6, 8, 20
    ids = torch.randint(3, vocab, (n, p + t), generator=g)
    mask = torch.zeros(n, p + t, dtype=torch.long)
    for i in range(n):
        mask[i, p - 3 - i % 4 : p] = 1
        mask[i, p : p + 5 + 3 * i] = 1
    real = mask[:, p:].bool()
    senior = real & (torch.rand(real.shape, generator=g) < 0.6)
    old = -torch.rand(n, t, generator=g) * real
    return UpdateBatch(ids, mask, p, old, None, torch.randn(n, generator=g), senior, real & ~senior)


def _reduce_worker(rank: int, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from tandem.modules import update
    from tandem.modules.logprobs import micro_batches
    from tandem.modules.loss import LossConfig
    from tandem.modules.sharding import gradient_sync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    cfg = LossConfig(lambda_jun=0.3)
    batch = _update_batch(_tiny().config.vocab_size, rank)
    rows = torch.arange(batch.ids.shape[0])
    parts = [(p, 1.0) for p in micro_batches(batch.mask.sum(1), 30)]
    real = dist.reduce_scatter_single
    result: dict = {"parts": len(parts)}
    for mode in ("once", "every"):
        model = shard(_tiny(), mesh)
        calls = [0]

        def counted(*args, calls=calls, **kwargs):
            calls[0] += 1
            return real(*args, **kwargs)

        dist.reduce_scatter_single = counted
        if mode == "every":  # what accumulating without gradient_sync did: reduce each time
            update.gradient_sync = lambda m, enabled: gradient_sync(m, True)
        try:
            update.accumulate(model, batch, rows, parts, cfg, 0.6, lambda x: x.backward())
        finally:
            dist.reduce_scatter_single = real
            update.gradient_sync = gradient_sync
        result[mode] = calls[0]
        result[f"{mode}_grads"] = [p.grad.full_tensor().flatten() for p in model.parameters()]
        result["units"] = sum(1 for m in model.modules() if is_sharded(m))
    once, every = torch.cat(result.pop("once_grads")), torch.cat(result.pop("every_grads"))
    result["relative_difference"] = float((once - every).norm() / every.norm())
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_gradients_are_reduced_once_a_mini_batch(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    mp.spawn(_reduce_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["parts"] >= 3 and r1["parts"] >= 3, "the mini-batch takes several micro-batches"
    # one reduce-scatter per sharded unit for the whole mini-batch, not one per micro-batch
    for r in (r0, r1):
        assert r["once"] == r["units"], r
        assert r["every"] == r["units"] * r["parts"], r
        # held unreduced on the device and reduced once: the same gradient
        assert r["relative_difference"] < 1e-6, r
