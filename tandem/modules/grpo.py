"""The LightningModule of GRPO and Tandem RL: owns the senior, its optimizer and the loss.

One training step reads top to bottom::

    rollouts  <- engine.generate(senior, junior, B prompts x G, sampler)   # [B*G, T]
    rewards   <- reward.score(texts, golds)                                 # [B*G]
    adv       <- group_advantages(rewards, G)                               # [B*G]
    for each of num_iterations passes, for each of mini_batches slices:
        loss  <- grpo_loss(senior log-probs, mask = authors == SENIOR)     # scalar
        optimizer step

Vanilla GRPO is the same module with the ``solo`` sampler. The junior (frozen, the reference
for KL) is lent by ``JuniorCallback`` through ``self.junior_holder`` and never registered as a
submodule.

The loss's log-probs (new, old and reference) are taken with the logits divided by the rollout
temperature (``logprob_temperature``), as verl, TRL and the authors' fork do: the ratio then
compares the distributions the tokens were sampled from. The old and reference log-probs come
from the engine, which records them while sampling, when it runs on the trainer's own float32
weights; otherwise (vLLM, a lower precision, a stale engine) from one no-grad pass of the
trainer's senior (and junior, for a KL term) before the update, as verl does
(``old_logprobs``). ``train/engine_logprob_gap`` logs the largest difference between the two.

Optimisation is manual because one batch of rollouts may feed several optimizer steps
(``num_iterations`` x ``mini_batches``). A training step is one batch of rollouts, as the
authors count it (verl's ``total_training_steps``, ``test_freq``, ``save_freq``): Lightning's
``global_step``, and with it ``max_steps``, validation, checkpoints, the progress bar and the
logs, counts batches; ``optimizer_steps`` (logged as ``train/optimizer_steps``) counts every
optimizer step. Each mini-batch's gradient is accumulated over packed micro-batches under a
token budget (``tandem.modules.logprobs``), and its log-probs never hold the vocabulary for more
than a chunk of tokens.

The senior is trained in float32 (its master weights, which AdamW updates: a 1e-6 step rounds
away in bfloat16); where ``dtype`` is lower, the forward and backward compute in it through the
trainer (``bf16-mixed`` autocast on one device, FSDP2's ``param_dtype`` when sharded), and the
export writes it in ``dtype``.

What this file leaves out: sampling (``tandem.engine``), the objective's algebra
(``tandem.modules.loss``), and the metrics it logs (``tandem.metrics``, listed by the config).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from tandem.data.datamodule import PromptBatch
from tandem.engine import JUNIOR, SENIOR, Rollouts, SamplingParams, StopReason, build_backend
from tandem.engine.backend import TorchBackend
from tandem.engine.cross import CrossRollouts
from tandem.metrics.base import build_metrics, measure_rollouts, values
from tandem.metrics.per_byte import JuniorBytesCrossEntropy, byte_table
from tandem.modules.checks import check_rollouts
from tandem.modules.logprobs import (
    CHUNK_TOKENS,
    lays_out_rows,
    micro_batches,
    pack,
    packed_logprobs,
    prompt_groups,
)
from tandem.modules.loss import (
    OLD_LOGPROB_SOURCES,
    LossConfig,
    group_advantages,
    zero_variance_groups,
)
from tandem.modules.models import load_causal_lm, load_tokenizer
from tandem.modules.sharding import gathered
from tandem.modules.stats import rollout_table
from tandem.modules.update import UpdateBatch, accumulate
from tandem.registry import REWARDS, SAMPLERS
from tandem.runs.faults import fault_point
from tandem.runs.resume import STEP_RECORD, honour_optimizer_config


class TandemGRPO(L.LightningModule):
    """GRPO / Tandem RL on a Hugging Face causal LM.

    Args:
        model: the senior's starting checkpoint (``tiny``, a hub name or a folder).
        sampler: registry name and arguments of the handoff sampler (``name`` plus kwargs).
        reward: registry name and arguments of the reward.
        generation: ``SamplingParams`` keyword arguments (temperature, top_p, top_k,
            max_new_tokens, ...); the seed, the samples per prompt and the log-prob temperature
            are set per call.
        loss: ``LossConfig`` keyword arguments.
        group_size: rollouts per prompt (G).
        optimizer: called with the senior's parameters, returns its optimizer (a Hydra
            ``_partial_``, e.g. of ``torch.optim.AdamW``).
        scheduler: called with the optimizer, returns a learning-rate scheduler stepped once per
            optimizer step; None: a constant learning rate.
        max_grad_norm: clip the gradient's norm to this; None: no clipping.
        num_iterations: passes over each batch of rollouts.
        mini_batches: optimizer steps per pass (the rollouts are split into this many slices).
        max_tokens_per_micro_batch: each mini-batch's rows are packed without padding into
            micro-batches of at most this many tokens (prompt and response), their gradients
            accumulated into the mini-batch's one optimizer step; None: one pack of them all.
        logprob_chunk_tokens: positions that go through the LM head at once in every log-prob
            pass (the logits held are at most this many tokens x the vocabulary).
        advantage: ``std`` or ``mean`` group normalisation.
        drop_equal_groups: give groups whose rewards are all equal no loss.
        mask_truncated: give responses cut at max_new_tokens no loss.
        dtype: the dtype the senior computes in and is exported in; its weights are held and
            updated in float32 (``trainer.precision: bf16-mixed`` or FSDP2's ``param_dtype``
            make the forward run in bfloat16; ``tandem.config`` refuses a bfloat16 dtype that
            no trainer setting computes in).
        seed: with the step index, decides every sample and coin (so resume is exact).
        val_sampler: sampler of the tandem validation pass (None: the training one).
        val_temperature: temperature of validation sampling (0: greedy).
        val_top_p: nucleus of validation sampling (None: the training rollouts' top_p).
        rollouts_to_log, rollout_log_every: rollout texts logged every so many steps.
        backend: what samples rollouts: ``name`` (``torch``, ``vllm``) plus its arguments
            (``tandem.engine.vllm_backend.VLLMBackend``, e.g. ``sync_every``); None: torch.
        logprob_temperature: divides the logits of the loss's log-probs (new, old, reference);
            None: the rollout temperature (verl, TRL and the authors' fork); 1.0: the raw model.
        old_logprobs: where the old (and reference) log-probs come from: ``engine`` (recorded
            while sampling), ``trainer`` (a no-grad pass of the trainer's models before the
            update) or ``auto`` (the engine when it samples with the trainer's own float32
            weights, else the trainer).
        metrics: what the rollouts of each step and validation pass feed, logged as
            ``train/<key>`` and ``val/<pass>/<key>``: ``{key: a METRICS name}``.
    """

    def __init__(
        self,
        model: str,
        sampler: dict[str, Any],
        reward: dict[str, Any],
        generation: dict[str, Any],
        loss: dict[str, Any],
        group_size: int,
        optimizer: Callable[[Iterable[Tensor]], Optimizer] = torch.optim.AdamW,
        scheduler: Callable[[Optimizer], LRScheduler] | None = None,
        max_grad_norm: float | None = 1.0,
        num_iterations: int = 1,
        mini_batches: int = 1,
        max_tokens_per_micro_batch: int | None = None,
        logprob_chunk_tokens: int = CHUNK_TOKENS,
        advantage: str = "std",
        drop_equal_groups: bool = False,
        mask_truncated: bool = False,
        dtype: str = "float32",
        seed: int = 0,
        val_sampler: dict[str, Any] | None = None,
        val_temperature: float = 0.0,
        val_top_p: float | None = None,
        rollouts_to_log: int = 2,
        rollout_log_every: int = 10,
        backend: dict[str, Any] | None = None,
        logprob_temperature: float | None = None,
        old_logprobs: str = "auto",
        metrics: dict[str, str] | None = None,
    ) -> None:
        if old_logprobs not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"old_logprobs ({old_logprobs!r}) must be one of {OLD_LOGPROB_SOURCES}: where "
                "the policy loss's old log-probs come from. Use auto unless you know why not."
            )
        super().__init__()
        # the factories are code, not values: a checkpoint holding them could not be loaded
        # with weights_only, and the run's config records them already
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.make_optimizer, self.make_scheduler = optimizer, scheduler
        self.automatic_optimization = False
        self.loss_cfg = LossConfig(**loss)
        self.senior: torch.nn.Module | None = None
        self.junior_holder = None  # set by JuniorCallback; a holder, never a submodule
        self.tokenizer = load_tokenizer(model)
        self.sampler = SAMPLERS.build(sampler["name"], tokenizer=self.tokenizer, **_args(sampler))
        val = val_sampler or sampler
        self.val_sampler = SAMPLERS.build(val["name"], tokenizer=self.tokenizer, **_args(val))
        self.solo_sampler = SAMPLERS.build("solo", tokenizer=self.tokenizer)
        self.reward = REWARDS.build(reward["name"], **_args(reward))
        self.backend = None  # built at the first rollout, once the junior is lent
        self.weights_lag = 0  # training steps the sampled weights are behind the senior
        # every optimizer step; global_step counts batches of rollouts (training steps)
        self.optimizer_steps = 0

    # -- model ---------------------------------------------------------------------------------
    def configure_model(self) -> None:
        # here, not in __init__, so that FSDP can shard the senior as it is created
        if self.senior is None:
            # float32 master weights whatever dtype computes: AdamW's 1e-6 steps round away
            # in bfloat16 (the trainer casts for the forward, the export writes dtype)
            self.senior = load_causal_lm(self.hparams.model, "float32")
            self.senior.config.use_cache = True
            self.senior.train()  # from_pretrained returns eval mode; the senior is trained
            # a sharding strategy (trainer=fsdp) shards it here; the junior is never a submodule
            shard = getattr(self.trainer.strategy, "shard", None) if self._trainer else None
            if shard is not None:
                shard(self.senior)

    @property
    def junior(self) -> torch.nn.Module | None:
        return None if self.junior_holder is None else self.junior_holder.model

    @property
    def junior_tokenizer(self) -> Any:
        """The junior's tokenizer when its vocabulary is its own (another family's); None for a
        junior of the senior's vocabulary, or none."""
        return None if self.junior_holder is None else self.junior_holder.tokenizer

    def configure_optimizers(self) -> Any:
        opt = self.make_optimizer(self.senior.parameters())
        if self.make_scheduler is None:
            return opt
        # stepped by hand in update(), once per optimizer step
        return {"optimizer": opt, "lr_scheduler": self.make_scheduler(opt)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # global_step counts batches of rollouts: the unit says so to a later resume
        checkpoint[STEP_RECORD] = {"unit": "batch", "optimizer_steps": self.optimizer_steps}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record = checkpoint.get(STEP_RECORD) or {}
        # a checkpoint of one optimizer step a batch counted the same either way
        self.optimizer_steps = int(record.get("optimizer_steps", checkpoint.get("global_step", 0)))
        # Lightning restores the optimizer and the scheduler after this hook, with the lr and
        # weight decay they were saved with: a resume that changed them must train with the
        # new. A sharding strategy has loaded the optimizer from its shards already
        strategy = self.trainer.strategy
        loaded = () if strategy.lightning_restore_optimizer else strategy.optimizers
        honour_optimizer_config(checkpoint, self.make_optimizer, self.make_scheduler, loaded)

    # -- rollouts ------------------------------------------------------------------------------
    def rollout(
        self,
        batch: PromptBatch,
        sampler: Any,
        samples: int,
        temperature: float | None = None,
        stream: int = 0,
        logprob_temperature: float | None = None,
        top_p: float | None = None,
    ) -> Rollouts:
        """``samples`` rollouts per prompt of ``batch``, the rows of a prompt adjacent.

        ``temperature`` and ``top_p`` replace the generation's own where given;
        ``logprob_temperature`` also records the loss's old and reference log-probs."""
        g = dict(self.hparams.generation)
        if temperature is not None:
            g["temperature"] = temperature
        if top_p is not None:
            g["top_p"] = top_p
        params = SamplingParams(
            **g,
            seed=self.step_seed(batch.index, stream),
            samples_per_prompt=samples,
            logprob_temperature=logprob_temperature,
        )
        if self.backend is None:
            spec = dict(self.hparams.backend or {"name": "torch"})
            name = spec.pop("name")
            self.backend = build_backend(
                name,
                self.senior,
                self.junior,
                self.tokenizer,
                junior_tokenizer=self.junior_tokenizer,
                **spec,
            )
        # new senior weights go into the backend (every sync_every steps for vLLM): the lag is
        # logged with every batch, so a stale engine shows
        self.place(shards=True)
        self.backend.sync(self.senior, self.global_step)
        self.weights_lag = self.global_step - self.backend.weights_step
        # the junior reads along when it writes, and when the loss needs its log-probs (the KL
        # penalty toward it): a solo arm with kl_beta > 0 must not train as plain GRPO
        reads = not sampler.solo or (self.training and self.loss_cfg.kl_beta > 0)
        if not isinstance(self.backend, TorchBackend):  # vLLM gathers its own copy in sync
            self.place(shards=False)  # its rollout reads no shard: the device is vLLM's
            return self.backend.generate(batch.prompt_ids, sampler, params, junior=reads)
        # a junior of another family reads the prompts in its own chat format
        cross = reads and self.junior_tokenizer is not None
        junior_prompts = batch.prompt_ids_for(self.junior_tokenizer) if cross else None
        # the torch engine samples from the trainer's senior: sharded, it is gathered whole once
        # for the rollout, or layer by layer at every token with the ranks in lockstep
        with gathered(self.senior, self.rollout_gather) as lockstep:
            return self.backend.generate(
                batch.prompt_ids,
                sampler,
                params,
                junior=reads,
                lockstep=lockstep,
                junior_prompts=junior_prompts,
            )

    def place(self, shards: bool, optimizer_state: bool = False) -> None:
        """Where ``offload=between_phases`` keeps the senior's float32 shards and optimizer
        state for the phase that follows: on the device (True) or the host (False). Other
        layouts keep them where they are (``FSDP2Strategy.place``)."""
        place = getattr(self.trainer.strategy, "place", None) if self._trainer else None
        if place is not None:
            place(self.senior, shards, optimizer_state)

    @property
    def rollout_gather(self) -> str:
        """How rollouts read a sharded senior: the strategy's ``rollout_gather``, else whole."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        return getattr(strategy, "rollout_gather", "whole")

    def step_seed(self, index: int, stream: int) -> int:
        """A seed from (run seed, batch index, rank, stream): resume replays the same samples."""
        return hash((self.hparams.seed, index, self.global_rank, stream)) % (2**62)

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> Tensor:
        hp = self.hparams
        answers = batch.repeat(hp.group_size).answers
        t0 = time.perf_counter()
        rollouts = self.rollout(  # [B*G, T]
            batch, self.sampler, hp.group_size, logprob_temperature=self.loss_temperature
        )
        check_rollouts(rollouts, self.sampler)
        t1 = time.perf_counter()
        rewards = torch.tensor(self.reward.score(rollouts.texts, answers))  # [B*G]
        t2 = time.perf_counter()
        adv = group_advantages(rewards, hp.group_size, hp.advantage)  # [B*G]
        senior_mask, junior_mask = self.loss_masks(rollouts, rewards)  # [B*G, T] each
        stats = self.update(rollouts, adv, senior_mask, junior_mask)
        t3 = time.perf_counter()
        self.log_step(
            rollouts, rewards, stats, {"generate": t1 - t0, "reward": t2 - t1, "update": t3 - t2}
        )
        return stats["loss"]

    def loss_masks(self, rollouts: Rollouts, rewards: Tensor) -> tuple[Tensor, Tensor]:
        """Which tokens the policy loss and the imitation term see: the author masks, less
        truncated responses and equal-reward groups when so configured."""
        keep = torch.ones(rollouts.tokens.shape[0], dtype=torch.bool)  # [N]
        if self.hparams.mask_truncated:
            keep &= rollouts.stop_reasons.cpu() != StopReason.LENGTH
        if self.hparams.drop_equal_groups:
            equal = zero_variance_groups(rewards, self.hparams.group_size)  # [B]
            keep &= ~equal.repeat_interleave(self.hparams.group_size)
        keep = keep.unsqueeze(1)  # [N, 1]
        authors = rollouts.authors.cpu()
        return (authors == SENIOR) & keep, (authors == JUNIOR) & keep

    @property
    def loss_temperature(self) -> float:
        """What the loss divides the logits by: ``logprob_temperature``, else the rollouts'."""
        t = self.hparams.logprob_temperature
        return float(self.hparams.generation["temperature"] if t is None else t)

    def old_logprob_source(self) -> str:
        """``engine`` or ``trainer``: ``old_logprobs`` with ``auto`` resolved."""
        choice = self.hparams.old_logprobs
        if choice != "auto":
            return choice
        backend = (self.hparams.backend or {}).get("name", "torch")
        precision = str(self.trainer.precision) if self._trainer is not None else "32-true"
        # only the torch engine samples with the trainer's very weights; bf16 or a stale vLLM
        # engine gives log-probs the trainer would not compute
        same = backend == "torch" and self.hparams.dtype == "float32" and precision == "32-true"
        strategy = self._trainer.strategy if self._trainer is not None else None
        same &= not getattr(strategy, "lower_precision", False)
        return "engine" if same else "trainer"

    def update(
        self, rollouts: Rollouts, adv: Tensor, senior_mask: Tensor, junior_mask: Tensor
    ) -> dict[str, Tensor]:
        """``num_iterations`` passes of ``mini_batches`` optimizer steps over the rollouts, each
        mini-batch's gradient accumulated over packed micro-batches of at most
        ``max_tokens_per_micro_batch`` tokens (the same gradient as one pass over them all)."""
        hp = self.hparams
        opt, sched = self.optimizers(), self.lr_schedulers()
        ids, mask = rollouts.sequences()  # [N, P+T] each
        start = rollouts.prompt_tokens.shape[1]
        tokens = mask.sum(dim=1).cpu()  # [N] each row's real tokens
        groups = prompt_groups(ids, mask, start).cpu()  # [N] the rows that share a prompt
        slices = torch.arange(rollouts.tokens.shape[0]).chunk(hp.mini_batches)
        micros = [self.micro_batches(idx, tokens, groups) for idx in slices]
        self.place(shards=True)
        old, ref, gap = self.old_and_ref(rollouts, ids, mask, start, micros)  # [N, T] each
        # the update and its optimizer steps read the optimizer state too (verl loads both
        # for update_actor); both go back to the host once the last step is taken
        self.place(shards=True, optimizer_state=True)
        batch = UpdateBatch(ids, mask, start, old, ref, adv, senior_mask, junior_mask)
        steps = hp.num_iterations * len(slices)
        totals: dict[str, Tensor] = {}
        for i in range(hp.num_iterations):
            for k, (idx, parts) in enumerate(zip(slices, micros, strict=True)):
                stats, logps = accumulate(
                    self.senior,
                    batch,
                    idx,
                    parts,
                    self.loss_cfg,
                    self.loss_temperature,
                    self.manual_backward,
                    hp.logprob_chunk_tokens,
                )
                if i == k == 0 and gap is None:  # the engine's, before any optimizer step
                    gap = max(
                        _max_gap(lp.cpu(), old[rows], senior_mask[rows])
                        for lp, (rows, share) in zip(logps, parts, strict=True)
                        if share
                    )
                for key, v in stats.items():
                    totals[key] = totals.get(key, 0) + v / steps
                last = i == hp.num_iterations - 1 and k == len(slices) - 1
                norm = self.optimizer_step(opt, last=last)
                totals["grad_norm"] = totals.get("grad_norm", 0) + norm / steps
                if sched is not None:
                    sched.step()
        self.place(shards=False, optimizer_state=False)
        totals["engine_logprob_gap"] = gap
        return totals

    def optimizer_step(self, opt: Any, last: bool) -> Tensor:
        """Clip and step, then free the gradients; returns the gradient's norm before clipping
        (logged as ``train/grad_norm``, as verl and TRL log it). Only a batch's last step goes
        through Lightning's optimizer wrapper, which counts it: ``global_step`` counts batches
        of rollouts (the authors' training steps); the others take the strategy's same path
        uncounted, and ``optimizer_steps`` counts them all."""
        hp = self.hparams
        grads = [p.grad for p in self.senior.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        # a sharded senior's norm is a partial sum on each rank until it is reduced
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.clip_gradients(opt, gradient_clip_val=hp.max_grad_norm, gradient_clip_algorithm="norm")
        if last:
            opt.step()
        else:
            self.trainer.strategy.optimizer_step(opt.optimizer, closure=_no_closure)
        self.optimizer_steps += 1
        # freed as soon as the step has used them, not before the next backward: the next
        # rollout then never holds them beside the gathered senior
        opt.zero_grad(set_to_none=True)
        fault_point("update", self.optimizer_steps)
        return norm.detach().float().cpu()

    def micro_batches(
        self, rows: Tensor, tokens: Tensor, groups: Tensor
    ) -> list[tuple[Tensor, float]]:
        """``rows`` (one mini-batch) split into packs of at most ``max_tokens_per_micro_batch``
        tokens, the rows of a prompt together where they fit, each with its share of the loss
        (1). Every rank makes as many forwards (DDP
        and FSDP2 forwards and backwards are collectives): one with fewer packs than another
        repeats its first with a share of 0."""
        parts = [
            rows[p]
            for p in micro_batches(
                tokens[rows], self.hparams.max_tokens_per_micro_batch, groups[rows]
            )
        ]
        count = len(parts)
        if self.trainer.world_size > 1:
            most = torch.tensor(count, device=self.device)
            count = int(self.trainer.strategy.reduce(most, reduce_op="max"))
        return [(p, 1.0) for p in parts] + [(parts[0], 0.0)] * (count - len(parts))

    def logprobs(
        self,
        model: torch.nn.Module,
        ids: Tensor,
        mask: Tensor,
        start: int,
        rows: Tensor,
        temperatures: list[float],
    ) -> list[Tensor]:
        """``[len(rows), T]`` log-probs of ``rows``' response tokens under ``model``, one per
        temperature, from one packed forward (as ``accumulate`` reads them)."""
        packed = pack(ids[rows], mask[rows], start, share_prompts=lays_out_rows(model))
        return packed_logprobs(model, packed, temperatures, self.hparams.logprob_chunk_tokens)

    def old_and_ref(
        self,
        rollouts: Rollouts,
        ids: Tensor,
        mask: Tensor,
        start: int,
        micros: list[list[tuple[Tensor, float]]],
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The loss's old and reference log-probs ``[N, T]``, and the engine-trainer gap.

        From the engine, the gap is left ``None`` for ``update`` to measure on the first
        mini-batch (the only one seen before an optimizer step). From the trainer, each
        micro-batch is read as its update reads it, so that the first pass's ratio is exactly 1.
        """
        t = self.loss_temperature
        if self.old_logprob_source() == "engine":
            if rollouts.old_logprobs is None:
                raise ValueError(
                    "old_logprobs is engine but this backend records no log-probs at the loss "
                    f"temperature ({t}). Set module.old_logprobs=trainer (or auto)."
                )
            return rollouts.old_logprobs, rollouts.ref_logprobs, None
        # the engine's figure to compare with: at the loss temperature if it recorded that
        engine = rollouts.old_logprobs
        temps = [t] if engine is not None else [t, 1.0]
        ref = rollouts.ref_logprobs
        read_ref = ref is None and self.loss_cfg.kl_beta > 0 and self.junior is not None
        shape = rollouts.tokens.shape
        old, raw = torch.zeros(shape), torch.zeros(shape)
        ref = torch.zeros(shape) if read_ref else ref
        with torch.no_grad():
            for rows, share in (part for parts in micros for part in parts):
                lps = self.logprobs(self.senior, ids, mask, start, rows, temps)
                if read_ref:
                    (ref_rows,) = self.logprobs(self.junior, ids, mask, start, rows, [t])
                if not share:  # a repeat that keeps the ranks in step
                    continue
                old[rows] = lps[0].cpu()
                raw[rows] = lps[-1].cpu()
                if read_ref:
                    ref[rows] = ref_rows.cpu()
        engine_lp = engine if engine is not None else rollouts.senior_logprobs
        gap = _max_gap(
            old if engine is not None else raw, engine_lp.cpu(), rollouts.senior_mask.cpu()
        )
        return old, ref, gap

    def log_step(
        self,
        rollouts: Rollouts,
        rewards: Tensor,
        stats: dict[str, Tensor],
        seconds: dict[str, float],
    ) -> None:
        g = self.hparams.group_size
        total = sum(seconds.values())
        values = {
            "train/reward": rewards.mean(),
            "train/reward_std": rewards.std() if rewards.numel() > 1 else torch.tensor(0.0),
            "train/zero_variance_groups": zero_variance_groups(rewards, g).float().mean(),
            **self.measure("train", rollouts, rewards),
            **{f"train/{k}": v for k, v in stats.items()},
            "train/lr": torch.tensor(self.optimizers().param_groups[0]["lr"]),
            "train/optimizer_steps": torch.tensor(float(self.optimizer_steps)),
            "train/weights_lag": torch.tensor(float(self.weights_lag)),
            **{f"time/{k}": torch.tensor(v) for k, v in seconds.items()},
            "time/step": torch.tensor(total),
            "time/tokens_per_second": rollouts.mask.sum() / max(total, 1e-9),
            **self.legibility(rollouts),
        }
        self.log_dict(
            {k: torch.as_tensor(v, dtype=torch.float32) for k, v in values.items()},
            sync_dist=True,
            batch_size=rewards.numel(),
        )
        # short names for the progress bar, of what this run logs (metrics come from its config)
        bar = (("reward", "train/reward"), ("senior", "train/senior_share"))
        for name, key in ((n, k) for n, k in bar if k in values):
            self.log(
                name,
                values[key],
                prog_bar=True,
                logger=False,
                sync_dist=True,
                batch_size=rewards.numel(),
            )
        every = self.hparams.rollout_log_every
        if every and self.global_rank == 0 and self.global_step % every == 0:
            self.log_rollout_texts(
                rollout_table(rollouts, rewards, self.tokenizer, self.hparams.rollouts_to_log)
            )

    def legibility(self, rollouts: Rollouts) -> dict[str, Tensor]:
        """``train/junior_ce_per_byte``: the junior's nats per byte of the senior's words, as
        the engine recorded them (its own tokens across vocabularies, the shared ones else);
        nothing when the junior did not read along."""
        metric = JuniorBytesCrossEntropy()
        if isinstance(rollouts, CrossRollouts) and rollouts.junior is not None:
            j = rollouts.junior
            metric.update(j.logprobs.cpu(), j.byte_lengths.cpu(), j.authors.cpu() == SENIOR)
        elif rollouts.junior_logprobs is not None:
            tokens = rollouts.tokens.cpu()
            sizes = byte_table(self.tokenizer, int(tokens.max()) + 1)[tokens]  # [N, T]
            metric.update(rollouts.junior_logprobs.cpu(), sizes, rollouts.senior_mask.cpu())
        else:
            return {}
        value = metric.compute()
        return {} if value.isnan() else {"train/junior_ce_per_byte": value.float()}

    def log_rollout_texts(self, text: str) -> None:
        for logger in self.loggers:
            run = getattr(logger, "experiment", None)
            if hasattr(run, "track"):  # Aim
                from aim import Text

                run.track(Text(text), name="rollouts", step=self.global_step)

    # -- validation ----------------------------------------------------------------------------
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        for name, sampler in (("solo", self.solo_sampler), ("tandem", self.val_sampler)):
            rollouts = self.rollout(
                batch,
                sampler,
                1,
                self.hparams.val_temperature,
                stream=1_000_000 + batch_idx,
                top_p=self.hparams.get("val_top_p"),
            )
            rewards = torch.tensor(self.reward.score(rollouts.texts, batch.answers))
            self.log(
                f"val/{name}/accuracy",
                rewards.mean(),
                sync_dist=True,
                batch_size=len(batch),
                prog_bar=name == "tandem",
            )
            # each batch's values, averaged over batches by Lightning as the accuracy is
            self.log_dict(
                self.measure(f"val/{name}", rollouts, rewards),
                sync_dist=True,
                batch_size=len(batch),
            )

    def measure(self, prefix: str, rollouts: Rollouts, rewards: Tensor) -> dict[str, Tensor]:
        """The configured metrics of one batch of rollouts, by ``<prefix>/<key>``; a metric
        that saw nothing it counts (NaN) is left out."""
        metrics = build_metrics(self.hparams.metrics or {})
        measure_rollouts(metrics, rollouts, rewards)
        out = {f"{prefix}/{k}": v.float() for k, v in values(metrics).items()}
        return {k: v for k, v in out.items() if not v.isnan()}


def _no_closure() -> None:
    """The closure of a manual optimizer step: the backward has run already."""


def _args(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "name"}


def _max_gap(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """The largest ``|a - b|`` over ``mask`` (0 with nothing masked in)."""
    gap = (a - b).abs().masked_fill(~mask.bool(), 0.0)
    return gap.max() if gap.numel() else torch.tensor(0.0)
