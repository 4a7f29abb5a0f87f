"""The vLLM backend: solo sampling at scale, and tandem generation in one vLLM engine.

Solo, without a junior: a plain engine of the senior, one request per rollout row
(``samples_per_prompt`` rows share their prompt's prefix cache), the raw log-prob of each sampled
token from vLLM (``logprobs_mode="raw_logprobs"``: the model's own log-softmax at temperature
1, before temperature, top-k/top-p and logits processors; the torch engine records the same).

With a junior: one engine holding both models (``tandem.engine.vllm_pair``), each built from its
own config; a batch is one ``generate`` call, the schedule stepped per row by the pen processor
(``tandem.engine.vllm_processors``), which records each token's author and its log-probs under
both models. Solo rows on it read the junior along at no extra call. A junior of another
vocabulary is the torch engine's (``tandem.engine.cross``); a pair whose KV pages cannot share
one block table is refused before any engine starts (``pair_refusal``).

Where it runs (``tandem.engine.vllm_engine``): the model runner, CUDA graphs, sleep mode, the
seeds and one engine per rank are decided from the device and the trainer's processes, and said
once in the log.

Failures: an exception inside vLLM's step (the pen processor, the pair model) would leave the
batch's requests running in vLLM's scheduler, and the next ``generate`` would wait on them for
ever. The backend aborts them and raises once (``EngineFailed``, with the cause); the next
``generate`` runs as on a fresh engine.

Weights: ``load_weights`` puts the senior's new weights into the running engine in-process
(``LLM.collective_rpc("reload_weights", weights_iterator=...)``, then ``reset_prefix_cache`` so
that no KV computed under the old weights is reused) and records the step they come from in
``weights_step``, which ``generate`` logs with every batch. An FSDP-sharded senior's parameters
are ``DTensor`` shards: each is gathered whole (``full_tensor``) as vLLM reads it, one tensor at
a time, so no rank holds a second full copy.

What this file leaves out: the pair model, its rows and its processors (``vllm_pair``,
``vllm_pens``, ``vllm_processors``) and the engine's settings (``vllm_engine``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandem.assets import resolve
from tandem.engine.backend import Weights
from tandem.engine.base import PAD, SENIOR, Rollouts, SamplingParams, StopReason
from tandem.engine.layout import Prompts, decoded, eos_ids, finish, pad_id, padded
from tandem.engine.vllm_engine import (
    engine_setup,
    eos_sources,
    folder_config,
    folder_tokenizer,
    on_gpu,
    processes,
    say_once,
    set_environment,
)
from tandem.engine.vllm_pair import ARCHITECTURE, QuietJuniorReload, pair_refusal, register
from tandem.engine.vllm_pens import KEY, run_pens
from tandem.registry import BACKENDS
from tandem.samplers.base import Sampler

log = logging.getLogger(__name__)


class EngineFailed(RuntimeError):
    """vLLM failed inside a batch; its requests were aborted and the engine goes on."""


@dataclass
class Row:
    """One rollout in the making."""

    context: list[int]  # prompt + response so far
    prompt_length: int
    tokens: list[int] = field(default_factory=list)
    authors: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the author's
    stop: int | None = None


@BACKENDS.register("vllm")
class VLLMBackend:
    """A vLLM engine in this process: the senior alone, or the senior and the junior.

    Args:
        senior: the senior's model folder (or hub name, or ``tiny``).
        junior: the junior's; ``None`` for solo only.
        tokenizer: decodes ``Rollouts.texts`` and supplies the pad id.
        dtype: the engine's dtype (float32 to match the torch engine's log-probs).
        seed: the engine's seed (the rollouts' draws come from ``params.seed``).
        max_model_len: the longest prompt + response (None: the model's own limit).
        kv_cache_gib: the KV cache's host memory on the CPU (on GPUs: ``gpu_memory_utilization``).
        sync_every: ``sync`` loads the senior's weights every this many training steps.
        model_runner: ``v1`` or ``v2``: vLLM's model runner on GPUs (``tandem.engine.vllm_engine``).
        sleep: sleep while the trainer updates (None: on GPUs).
        seeds: ``batch``, ``request`` or ``auto`` (``tandem.engine.vllm_engine``).
        engine_args: more ``vllm.LLM`` arguments (e.g. ``gpu_memory_utilization``).
    """

    def __init__(
        self,
        senior: str,
        junior: str | None = None,
        tokenizer: Any = None,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        kv_cache_gib: float = 1.0,
        sync_every: int = 1,
        model_runner: str = "v1",
        sleep: bool | None = None,
        seeds: str = "auto",
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every ({sync_every}) must be >= 1 training step.")
        self.paths = (resolve(senior), None if junior is None else resolve(junior))
        configs = [folder_config(p) for p in self.paths if p is not None]
        refusal = None if junior is None else pair_refusal(*configs, max_model_len)
        if refusal:
            raise ValueError(f"one vLLM engine cannot hold this senior and junior: {refusal}")
        world, rank, local = processes()
        self.setup = engine_setup(
            gpu=on_gpu(),
            world=world,
            rank=rank,
            local_rank=local,
            engine_args=engine_args,
            model_runner=model_runner,
            sleep=sleep,
            seeds=seeds,
            kv_cache_gib=kv_cache_gib,
        )
        set_environment(self.setup.env)
        say_once(self.setup.notes)
        self.tokenizer = tokenizer if tokenizer is not None else folder_tokenizer(self.paths[0])
        self.configs = eos_sources(self.paths[0])  # where the senior names its EOS ids
        self.sync_every, self.weights_step = sync_every, -1
        self.resumed = 0  # requests vLLM preempted and took back, in the last pair batch
        self.asleep: set[str] = set()
        #: ``batch`` or ``request`` (the setup's; benchmarks/vllm.py measures both)
        self.seeds = self.setup.seeds
        self.llm = self._start(dtype, seed, max_model_len)
        self.vocab = self.llm.llm_engine.model_config.get_vocab_size()

    @classmethod
    def from_models(cls, senior: Any, junior: Any | None, tokenizer: Any, **options: Any):
        """The engine for Hugging Face models, from the folders they were loaded from."""
        paths = [None if m is None else getattr(m, "name_or_path", None) for m in (senior, junior)]
        if not paths[0] or (junior is not None and not paths[1]):
            raise ValueError(
                "the vLLM backend starts its engine from model folders, but a model has no "
                "name_or_path. Load it with from_pretrained, or use backend=torch."
            )
        return cls(paths[0], paths[1], tokenizer, **options)

    @property
    def pair(self) -> bool:
        """Whether the engine holds the junior too."""
        return self.paths[1] is not None

    def _start(self, dtype: str, seed: int, max_model_len: int | None) -> Any:
        from vllm import LLM

        args = dict(
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            # no chunked prefill: a seeded request whose prompt is split has its sample
            # discarded, and vLLM 0.32 then rewinds its generator, which CPU generators refuse
            enable_chunked_prefill=False,
        )
        if self.pair:
            from tandem.engine.vllm_processors import pen_processor

            register()
            overrides = {
                "architectures": [ARCHITECTURE],
                "tandem_architecture": folder_config(self.paths[0])["architectures"][0],
                "tandem_junior": self.paths[1],
                "tandem_board": f"{id(self)}",
            }
            # the processor must see each row's last token before the next forward
            args |= dict(hf_overrides=overrides, async_scheduling=False)
            args["logits_processors"] = [pen_processor(self.setup.v2)]
        llm = LLM(model=self.paths[0], **(args | self.setup.args))
        if llm.llm_engine.vllm_config.use_v2_model_runner != self.setup.v2:
            raise RuntimeError(
                f"vLLM chose its {'V2' if not self.setup.v2 else 'V1'} model runner where the "
                "backend set the other (VLLM_USE_V2_MODEL_RUNNER): the pair's processor would "
                "not be loaded. Report it with vLLM's version."
            )
        return llm

    # -- weights and sleep -------------------------------------------------------------------
    def load_weights(self, weights: Weights, step: int) -> None:
        """Load the senior's new weights (HF names) into the running engine."""
        self._wake("weights")
        items = weights.items() if hasattr(weights, "items") else weights
        stream = ((name, full_tensor(t.detach())) for name, t in items)
        # the pair's junior layers are left alone by design; a plain engine's warnings stay
        quiet = QuietJuniorReload() if self.pair else None
        layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if quiet is not None:
            layerwise.addFilter(quiet)
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": stream, "is_checkpoint_format": True}
            )
        finally:
            if quiet is not None:
                layerwise.removeFilter(quiet)
        self.llm.reset_prefix_cache()  # cached KV was computed by the old weights
        self.weights_step = step

    def sync(self, senior: Any, step: int) -> None:
        """Load ``senior``'s weights when ``sync_every`` steps have passed (or never loaded),
        waking the engine first where it sleeps: weights, the load, then its KV cache.

        A sharded senior's parameters are gathered one tensor at a time as vLLM reads them (so
        every rank must sync at the same step, as the trainer does)."""
        if self.weights_step < 0 or step - self.weights_step >= self.sync_every:
            self.load_weights(senior.state_dict(), step)
        self._wake()

    def sleep(self) -> None:
        """Free the device while the trainer updates (sleep mode, where on): the weights go to
        host memory, the KV cache is dropped; the next ``sync`` or ``generate`` wakes it."""
        if self.setup.sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def _wake(self, *tags: str) -> None:
        todo = [t for t in (tags or ("weights", "kv_cache")) if t in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep -= set(todo)

    # -- generation --------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[Tensor],
        sampler: Sampler | None = None,
        params: SamplingParams | None = None,
        *,
        junior: bool | None = None,
    ) -> Rollouts:
        """Rollouts as the torch engine's ``generate`` gives them (see ``tandem.engine.base``).

        Args:
            prompts: prompt token ids, one sequence per prompt.
            sampler: who authors; ``None`` or solo: the senior alone.
            params: sampling parameters.
            junior: whether the junior's log-probs are recorded (None: when it writes).

        Raises:
            EngineFailed: vLLM failed inside the batch (its requests were aborted).
        """
        params = params if params is not None else SamplingParams()
        solo = sampler is None or getattr(sampler, "solo", False)
        reads = junior if junior is not None else not solo
        if (reads or not solo) and not self.pair:
            raise ValueError(
                f"{sampler!r} needs the junior, but this backend was built without one. "
                "Pass junior=<its folder>, or use the solo sampler."
            )
        eos = eos_ids(params.eos_token_ids, self.configs)
        g = params.samples_per_prompt
        batch = Prompts.of(prompts, pad_id(eos, (self.tokenizer,)))
        width = batch.ids.shape[1]
        rows = [
            Row(ids[width - k :].tolist(), k)
            for ids, k in zip(batch.ids, batch.lengths.tolist(), strict=True)
            for _ in range(g)
        ]
        log.info(
            "vllm: %d rows, senior weights of step %d%s",
            len(rows),
            self.weights_step,
            "" if solo else f", tandem with {sampler!r}",
        )
        self._wake()
        if not self.pair:
            self._solo(rows, params, eos)
            return self._rollouts(rows, batch, g, eos, None)
        if not solo:
            tables = sampler.tables
            sampler.bind(self.vocab if tables is None else max(self.vocab, tables.size), "cpu")
        junior_lps = self._pair_generate(rows, None if solo else sampler, params, eos)
        return self._rollouts(rows, batch, g, eos, junior_lps if reads else None)

    def _pair_generate(self, rows: list[Row], sampler: Sampler | None, params, eos):
        """Every row in one ``generate`` call of the pair engine; fills ``rows`` with their
        tokens, authors and senior log-probs, and returns the junior's log-probs."""
        # the id forced where a schedule ends (a cap on turns), cut from the rows
        stop = eos[0] if eos else int(self.tokenizer.pad_token_id or 0)
        pens = run_pens(
            lambda sampling: self._run(rows, sampling, params.seed),
            lambda i, key: self._request(rows[i], i, params, eos, key, stop),
            rows,
            sampler,
            params,
            stop,
        )
        self.resumed = pens.resumed
        junior = []
        for i, row in enumerate(rows):
            junior.append([])
            for token, author, senior_lp, junior_lp in pens.written[i][: pens.cut[i]]:
                junior[-1].append(junior_lp)
                if self._emit(row, token, senior_lp, author, params, eos):
                    break
            if row.stop is None:
                row.stop = StopReason.LENGTH  # the schedule's own end: a cap on turns
        return junior

    def _request(self, row: Row, index: int, params: SamplingParams, eos, key=None, stop=None):
        from vllm import SamplingParams as VSamplingParams

        # params.kv_cache_gib is the torch engine's: vLLM sizes its own cache (engine_args'
        # gpu_memory_utilization; on CPU, this backend's own kv_cache_gib), so it is not read
        return VSamplingParams(
            n=1,
            max_tokens=params.budget(row.prompt_length),
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=_mix(params.seed, index) if self.seeds == "request" else None,
            logprobs=None if key is not None else 0,  # the pen records both models' own
            stop_token_ids=list(eos) + ([stop] if key is not None else []),
            ignore_eos=True,  # the stop ids above are the only EOS, as in the torch engine
            detokenize=False,
            extra_args=None if key is None else {KEY: key},
        )

    def _run(self, rows: list[Row], sampling: list[Any], seed: int) -> list[Any]:
        """One ``generate`` call; on a failure inside vLLM, its requests are aborted."""
        prompts = [{"prompt_token_ids": r.context} for r in rows]
        try:
            with self._seeded(seed):
                return [o.outputs[0] for o in self.llm.generate(prompts, sampling, use_tqdm=False)]
        except Exception as error:
            aborted = abort_unfinished(self.llm)
            raise EngineFailed(
                f"vLLM failed inside a batch of {len(rows)} requests ({type(error).__name__}: "
                f"{error}). Its {aborted} unfinished requests were aborted; the engine serves "
                "the next batch."
            ) from error
        except BaseException:  # an interrupt: leave the engine clean, and go on stopping
            abort_unfinished(self.llm)
            raise

    @contextlib.contextmanager
    def _seeded(self, seed: int) -> Iterator[None]:
        """``seeds="batch"``: the device's generator seeded for this call from ``seed``, and
        the process's own random state as it was afterwards."""
        if self.seeds != "batch":
            yield
            return
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(_mix(seed, 0))
            yield

    def _solo(self, rows: list[Row], params: SamplingParams, eos: tuple[int, ...]) -> None:
        sampling = [self._request(r, i, params, eos) for i, r in enumerate(rows)]
        for row, out in zip(rows, self._run(rows, sampling, params.seed), strict=True):
            lps = [d[t].logprob for t, d in zip(out.token_ids, out.logprobs, strict=True)]
            for token, lp in zip(out.token_ids, lps, strict=True):
                if self._emit(row, token, lp, SENIOR, params, eos):
                    break

    def _emit(self, row: Row, token: int, lp: float, author: int, params, eos) -> bool:
        """Append one token; True when the row is finished."""
        row.tokens.append(token)
        row.authors.append(author)
        row.logprobs.append(lp)
        row.context.append(token)
        if token in eos:
            row.stop = StopReason.EOS
        elif len(row.tokens) >= params.budget(row.prompt_length):
            row.stop = StopReason.LENGTH
        return row.stop is not None

    def _rollouts(self, rows, batch: Prompts, g: int, eos, junior_lps) -> Rollouts:
        pad = pad_id(eos, (self.tokenizer,))
        tokens = padded([r.tokens for r in rows], pad, torch.long)  # [N, T]
        lengths = torch.tensor([len(r.tokens) for r in rows])  # [N]
        return finish(
            Rollouts,
            tokens=tokens,
            authors=padded([r.authors for r in rows], PAD, torch.long),  # [N, T]
            senior_logprobs=padded([r.logprobs for r in rows], 0.0, torch.float32),  # [N, T]
            junior_logprobs=None if junior_lps is None else padded(junior_lps, 0.0, torch.float32),
            lengths=lengths,
            stop_reasons=torch.tensor([int(r.stop) for r in rows]),
            **batch.rows(g),
            pad_token_id=pad,
            texts=decoded(self.tokenizer, tokens, lengths),
        )


def abort_unfinished(llm: Any) -> int:
    """Abort every request ``llm`` has not finished (a ``generate`` that raised leaves its
    batch running in the scheduler); how many there were."""
    engine = llm.llm_engine
    ids = list(engine.output_processor.request_states)
    if ids:
        engine.abort_request(ids, internal=True)
    return len(ids)


def _mix(seed: int, row: int) -> int:
    """A request's (or a batch's) seed from (params.seed, row): reruns repeat it."""
    return (seed * 1_000_003 + row * 7_919) % (2**31 - 1)


def full_tensor(t: Tensor) -> Tensor:
    """``t`` whole: a ``DTensor`` shard (an FSDP2 senior's parameter) is all-gathered, a
    collective every rank of its mesh must join; any other tensor is itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
