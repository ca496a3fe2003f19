"""The one place this package imports llama-cpp-python, after choosing how its OpenMP threads wait.

llama-cpp-python's wheels build ggml with OpenMP: each op of a step ends at a barrier (hundreds a step), where a
thread that arrives first polls 300,000 times (libgomp's default) before it sleeps. On a machine with more runnable
threads than cores (a desktop's other programs, another model, a build), the polling thread holds the core its peer
needs to finish, and a step takes many times its share: 4 decodes of the bench model took 8.9 s instead of 0.34 s
at load 19 on 2 cores (docs/bench/omp_wait.md). 1,000 polls cover a barrier whose peer is running, then the thread
sleeps. libgomp reads this once, when llama.cpp's library loads (the first import of llama_cpp, here: every module of
this package imports it through this one, so registering the backend sets nothing); a user's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT wins.
"""
import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"

import llama_cpp  # noqa: E402
import llama_cpp.llama_cpp as L  # noqa: E402

__all__ = ["L", "llama_cpp"]
