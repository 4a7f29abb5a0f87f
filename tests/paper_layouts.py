"""The paper's layouts, as overrides of ``--config-name reproduce_paper``.

``reproduce_paper`` ships with FSDP2 over two cards and the vLLM pair on each (the plans'
fastest on 2 x 80 GB); the authors' own layout, which many plan tests are written against, is
one FSDP2 process on cuda:0 and the junior on cuda:1, sampled by the torch engine.
"""

TORCH = ("backend=torch",)
ONE_PROCESS = ("trainer=paper_gpus",)
AUTHORS = (*TORCH, *ONE_PROCESS, "model.junior_device=cuda:1", "generation.kv_cache_gib=64")
