"""Evaluating one senior (with its junior) on eval sets: pass@k, drift, legibility, team stats.

For each set, up to two sampling passes over its problems, ``n`` samples each:

- ``solo``: the senior alone. Then drift and legibility on these same outputs by teacher
  forcing (no new sampling): KL(senior || junior) per token, the junior's cross-entropy on the
  senior's tokens (``junior_ce``: per chain of thought, then the mean over them, as the paper;
  ``junior_ce_pooled``: per token over all of them), and the per-token overlap of the two
  distributions;
- ``handoff``: senior and junior together under the handoff sampler (the reasoning-step
  schedule by default), with the senior's token share and the handoffs per rollout.

Legibility is also measured per byte of the senior's text (``junior_ce_per_byte``), the figure
that holds across vocabularies. With a junior of another vocabulary (``junior_tokenizer``), the
per-token junior cross-entropies and the overlap do not apply and are not measured; drift is then
taken against the senior's own base (``base``), and the junior is teacher-forced on its own
tokens of the senior's text.

Each pass scores every sample with the reward, feeds the metrics (``tandem.metrics``), and
writes every rollout as a JSONL record. Seeds depend on (seed, pass, batch) only, so a rerun
draws the same samples.

What this file leaves out: loading models and configs (``tandem.evaluate``) and tables
(``tandem.evaluation.results``).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from tqdm.auto import tqdm

from tandem.engine import SENIOR, Rollouts, TorchBackend
from tandem.engine.cross import same_vocabulary
from tandem.evaluation.forcing import forced_chunks, junior_logprobs
from tandem.evaluation.records import RecordWriter, build_records
from tandem.evaluation.sets import EvalSet, Problems, load_problems
from tandem.metrics import (
    DistributionOverlap,
    JuniorCrossEntropy,
    PassAtK,
    PooledJuniorCrossEntropy,
    TokenKL,
    kl_divergence,
    token_overlap,
)
from tandem.metrics.base import build_metrics, measure_rollouts, values
from tandem.metrics.per_byte import JuniorBytesCrossEntropy, byte_table
from tandem.registry import SAMPLERS
from tandem.rewards import Verdict

log = logging.getLogger(__name__)

MODES = ("solo", "handoff")


class Evaluator:
    """Samples, scores and measures eval sets with a fixed senior, junior and reward.

    Args:
        senior: the Hugging Face causal LM under evaluation.
        junior: its frozen partner and the reference of drift (by default its base).
        tokenizer: the senior's tokenizer (the junior's too, unless ``junior_tokenizer``).
        reward: a reward with ``verify(texts, golds)`` (``tandem.rewards``).
        sampler: registry name (``name``) and arguments of the handoff sampler.
        batch_size: rollouts per generate call (``batch_size // n`` prompts, at least one).
        forcing_batch_size: rollouts per teacher-forcing forward pass.
        seed: decides every sample and coin.
        solo, handoff, drift: which passes run (drift needs solo).
        writer: where records go (None: nowhere).
        progress: show a progress bar over problems x samples.
        backend: what samples (``tandem.engine.build_backend``); None: the torch engine.
        metrics: what every pass's rollouts also feed, ``{key: a METRICS name}``, in the
            table as ``<pass>/<key>`` (the handoff pass's team statistics by default).
        junior_tokenizer: a junior of another vocabulary's tokenizer (None: ``tokenizer``).
        base: the reference of drift, the senior's base (None: the junior, which is the base
            by default); required with a junior of another vocabulary when ``drift``.
    """

    def __init__(
        self,
        senior: torch.nn.Module,
        junior: torch.nn.Module,
        tokenizer: Any,
        reward: Any,
        sampler: dict[str, Any],
        *,
        batch_size: int = 64,
        forcing_batch_size: int = 4,
        seed: int = 0,
        solo: bool = True,
        handoff: bool = True,
        drift: bool = True,
        writer: RecordWriter | None = None,
        progress: bool = True,
        backend: Any = None,
        metrics: dict[str, str] | None = None,
        junior_tokenizer: Any = None,
        base: torch.nn.Module | None = None,
    ) -> None:
        assert solo or not drift, "drift is measured on the solo outputs: set solo=true"
        self.senior, self.junior, self.tokenizer, self.reward = senior, junior, tokenizer, reward
        self.sampler = dict(sampler)
        self.batch_size, self.forcing_batch_size = batch_size, forcing_batch_size
        self.seed, self.writer, self.progress = seed, writer, progress
        self.modes = [m for m, on in zip(MODES, (solo, handoff), strict=True) if on]
        self.drift = drift
        self.configured = dict(metrics or {})
        self.junior_tokenizer = junior_tokenizer
        self.cross = not same_vocabulary(tokenizer, junior_tokenizer)
        # drift is measured against the senior's base; a same-vocabulary junior is that base
        self.base = base if base is not None else junior
        if self.cross and drift and base is None:
            raise ValueError(
                "the junior has a vocabulary of its own, so drift needs the senior's base as a "
                "model of its own: pass base=<the senior's base model> (tandem.evaluation."
                "models.load_pair loads it), or set drift=false."
            )
        self.bytes = byte_table(tokenizer)  # [V] for the per-byte legibility of a shared vocab
        if backend is None:
            backend = TorchBackend(senior, junior, tokenizer, junior_tokenizer)
        self.backend = backend

    def run(self, eval_set: EvalSet) -> tuple[dict[str, float], Problems]:
        """Every pass on one set: its table (metric -> value) and the problems it used."""
        problems = load_problems(eval_set, self.tokenizer)
        table: dict[str, float] = {}
        for mode in self.modes:
            table.update(self.run_mode(eval_set, problems, mode))
        return table, problems

    def run_mode(self, eval_set: EvalSet, problems: Problems, mode: str) -> dict[str, float]:
        """One sampling pass (``solo`` or ``handoff``) over the problems: its metrics."""
        eval_set = eval_set.for_mode(mode)
        metrics = self.metrics(eval_set, mode)
        sampler = self.build_sampler(mode)
        n = eval_set.n
        per_call = max(1, self.batch_size // n)
        pace = Pace(f"{eval_set.name} {mode}", len(problems), n, per_call, eval_set.max_new_tokens)
        bar = tqdm(
            total=len(problems) * n,
            desc=f"{eval_set.name} {mode}",
            unit="sample",
            # on a terminal; into a file its redrawing is noise, and Pace says the same
            disable=not self.progress or not sys.stderr.isatty(),
        )
        for b, lo in enumerate(range(0, len(problems), per_call)):
            idx = list(range(lo, min(lo + per_call, len(problems))))
            params = eval_set.params(self.seed + 10_007 * b + MODES.index(mode))
            prompts = [problems.prompt_ids[i] for i in idx]
            # a junior of another family reads the prompts in its own chat format
            own = problems.prompt_ids_for(self.junior_tokenizer, idx) if self.cross else None
            extra = {"junior_prompts": own} if own is not None and mode != "solo" else {}
            rollouts = self.backend.generate(
                prompts, sampler, params, junior=mode != "solo", **extra
            )
            own_rows = None if own is None else [x for x in own for _ in range(n)]
            golds = [problems.answers[i] for i in idx for _ in range(n)]
            verdicts = self.verify(rollouts.texts, golds)
            scores = torch.tensor([v.score for v in verdicts])  # [B*n]
            extra = self.update(metrics, rollouts, scores.view(len(idx), n), own_rows)
            if self.writer is not None:
                context = {
                    "set": eval_set.name,
                    "mode": mode,
                    "n": n,
                    "problem_offset": lo,
                    "problems": [problems.problems[i] for i in idx],
                    "answers": [problems.answers[i] for i in idx],
                    "prompt_ids": prompts,
                }
                records = build_records(rollouts, verdicts, context, self.tokenizer, extra)
                self.writer.write(eval_set.name, records)
            bar.update(rollouts.num_rows)
            pace.batch_done(b)
        bar.close()
        pace.done()
        # pass@k, lengths and team stats are this pass's; drift and legibility keys are full
        table = {k: float(v) for k, v in values(metrics).items()}
        return {k if "/" in k else f"{mode}/{k}": v for k, v in table.items()}

    def verify(self, texts: list[str], golds: list[str]) -> list[Verdict]:
        """The reward's verdicts; rewards without ``verify`` give their score and no reason."""
        if hasattr(self.reward, "verify"):
            return self.reward.verify(texts, golds)
        return [Verdict(s, "scored") for s in self.reward.score(texts, golds)]

    def metrics(self, eval_set: EvalSet, mode: str) -> dict[str, Metric]:
        """The metrics one pass feeds, by the name they take in the table."""
        out: dict[str, Metric] = {
            "pass": PassAtK(ks=eval_set.ks),
        }
        out.update(build_metrics(self.configured))
        if mode == "solo" and self.drift:
            out["drift/kl"] = TokenKL()
            out["legibility/junior_ce_per_byte"] = JuniorBytesCrossEntropy()
            if not self.cross:  # per-token figures need one vocabulary (tandem.metrics.per_byte)
                out.update(
                    {
                        "legibility/junior_ce": JuniorCrossEntropy(),
                        "legibility/junior_ce_pooled": PooledJuniorCrossEntropy(),
                        "legibility/overlap": DistributionOverlap(),
                    }
                )
        return out

    def build_sampler(self, mode: str) -> Any:
        """The pass's sampler (it holds no coins: the engine draws them from each batch's seed)."""
        if mode == "solo":
            return SAMPLERS.build("solo", tokenizer=self.tokenizer)
        spec = dict(self.sampler)
        return SAMPLERS.build(spec.pop("name"), tokenizer=self.tokenizer, **spec)

    def update(
        self,
        metrics: dict[str, Metric],
        rollouts: Rollouts,
        scores: Tensor,
        junior_prompts: list[list[int]] | None = None,
    ) -> dict[str, Tensor]:
        """Feed one batch (``scores [B, n]``) to the metrics; returns per-token values for its
        records. ``junior_prompts``: each row's prompt in a junior of another family's own ids."""
        metrics["pass"].update(scores > 0.5)  # [B, n]
        measure_rollouts({k: metrics[k] for k in self.configured}, rollouts, scores)
        if "drift/kl" in metrics:
            return self.force(metrics, rollouts, junior_prompts)
        return {}

    def force(
        self, metrics: dict[str, Metric], rollouts: Rollouts, junior_prompts: Any = None
    ) -> dict[str, Tensor]:
        """Drift and legibility on a solo batch by teacher forcing both models."""
        if self.cross:
            return self.force_cross(metrics, rollouts, junior_prompts)
        p = rollouts.prompt_tokens.shape[1]
        prompt_mask = torch.arange(p) >= (p - rollouts.prompt_lengths.cpu())[:, None]  # [N, P]
        shape = rollouts.tokens.shape
        per_token = {k: torch.zeros(shape) for k in ("kl", "overlap", "junior_logprobs")}
        chunks = forced_chunks(
            [self.senior, self.junior],
            rollouts.prompt_tokens.cpu(),
            prompt_mask,
            rollouts.tokens.cpu(),
            rollouts.mask.cpu(),
            self.forcing_batch_size,
        )
        for chunk in chunks:
            s, j = chunk.logits[0], chunk.logits[1].to(chunk.logits[0].device)  # [n, t, V]
            # the senior's own tokens (all of them in solo rows)
            mask = chunk.mask & (rollouts.authors.cpu()[chunk.rows, chunk.cols] == SENIOR)
            metrics["drift/kl"].update(s, j, mask)
            metrics["legibility/overlap"].update(s, j, mask)
            tokens = chunk.tokens.to(j.device)[..., None]
            values = {
                "kl": kl_divergence(s, j),
                "overlap": token_overlap(s, j),
                "junior_logprobs": j.float().log_softmax(-1).gather(-1, tokens).squeeze(-1),
            }
            # the [n, T] log-probs just computed: no second log-softmax over the vocabulary
            for key in ("legibility/junior_ce", "legibility/junior_ce_pooled"):
                metrics[key].update(values["junior_logprobs"], mask.to(j.device))
            sizes = self.bytes.to(j.device)[
                chunk.tokens.to(j.device).clamp(max=len(self.bytes) - 1)
            ]
            metrics["legibility/junior_ce_per_byte"].update(values["junior_logprobs"], sizes, mask)
            for k, v in values.items():
                per_token[k][chunk.rows, chunk.cols] = torch.where(mask, v.cpu(), 0.0)
        return per_token

    def force_cross(
        self,
        metrics: dict[str, Metric],
        rollouts: Rollouts,
        junior_prompts: list[list[int]] | None,
    ) -> dict[str, Tensor]:
        """Drift against the senior's base on its own tokens; the junior's legibility per byte
        on its own tokens of the same text, after ``junior_prompts`` (a junior of another
        vocabulary, reading the prompts in its own chat format)."""
        p = rollouts.prompt_tokens.shape[1]
        prompt_mask = torch.arange(p) >= (p - rollouts.prompt_lengths.cpu())[:, None]  # [N, P]
        kl = torch.zeros(rollouts.tokens.shape)
        models = [self.senior, self.base]
        args = (rollouts.prompt_tokens.cpu(), prompt_mask, rollouts.tokens.cpu())
        for chunk in forced_chunks(models, *args, rollouts.mask.cpu(), self.forcing_batch_size):
            s, b = chunk.logits[0], chunk.logits[1].to(chunk.logits[0].device)  # [n, t, V]
            mask = chunk.mask & (rollouts.authors.cpu()[chunk.rows, chunk.cols] == SENIOR)
            metrics["drift/kl"].update(s, b, mask)
            kl[chunk.rows, chunk.cols] = torch.where(mask, kl_divergence(s, b).cpu(), 0.0)
        if junior_prompts is None:  # a junior with no chat template: the senior's prompt text
            texts = [
                self.tokenizer.decode(row[m].tolist())
                for row, m in zip(rollouts.prompt_tokens.cpu(), prompt_mask, strict=True)
            ]
            junior_prompts = self.junior_tokenizer(texts, add_special_tokens=False)["input_ids"]
        lps, tokens, mask = junior_logprobs(
            self.junior,
            self.junior_tokenizer,
            junior_prompts,
            rollouts.texts,
            self.forcing_batch_size,
        )
        sizes = byte_table(self.junior_tokenizer, int(tokens.max()) + 1)[tokens]  # [N, T']
        metrics["legibility/junior_ce_per_byte"].update(lps, sizes, mask)
        return {"kl": kl}


class Pace:
    """What a sampling pass will do, said before it starts, and how long it will take, said
    once its first batch has shown the pace; then a line a quarter of the way, and at the end.

    Args:
        name: the set and the pass (``tiny solo``).
        problems, n, per_call: the problems, samples of each, problems per generate call.
        max_new_tokens: the longest response.
    """

    def __init__(self, name: str, problems: int, n: int, per_call: int, max_new_tokens: int):
        self.name, self.batches = name, -(-problems // per_call)
        self.started = time.perf_counter()
        self.quarters = 0
        log.info(
            "%s: %d problems x %d samples = %d rollouts of up to %d tokens, in %d batches",
            name,
            problems,
            n,
            problems * n,
            max_new_tokens,
            self.batches,
        )

    def batch_done(self, index: int) -> None:
        """After batch ``index`` (0-based): the estimate after the first, quarters after."""
        elapsed = time.perf_counter() - self.started
        if index == 0 and self.batches > 1:
            log.info(
                "%s: the first batch took %.0f s: about %s for the pass",
                self.name,
                elapsed,
                _duration(elapsed * self.batches),
            )
        quarter = 4 * (index + 1) // self.batches
        if 0 < quarter < 4 and quarter > self.quarters:
            self.quarters = quarter
            left = elapsed / (index + 1) * (self.batches - index - 1)
            done, later = _duration(elapsed), _duration(left)
            log.info("%s: %d%% in %s, about %s left", self.name, 25 * quarter, done, later)

    def done(self) -> None:
        log.info("%s: done in %s", self.name, _duration(time.perf_counter() - self.started))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
