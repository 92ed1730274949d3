"""Benchmarks (``vnpu bench ...``): each prints vnpu's figures beside baselines measured in the same
run.  One module per benchmark (``serve-om``: :mod:`.serve_om`), each with ``register(subparsers)``; :data:`BENCHMARKS` lists them."""

BENCHMARKS = ("launch", "memcpy", "hccl", "infer", "serve", "mdl", "sanitize", "memory", "scale", "overhead",
              "serve-om", "kernels", "torch")
