"""nbgrader's Validate button in the JupyterLab of `make lab` and Binder runs the notebook as the grader does.

binder/jupyter/nbgrader_config.py makes :class:`ValidateKernelManager` the kernel manager of Validate's run: the
kernel starts with ``TDD_QUICK=1`` (:data:`solutions.notebook.QUICK_ENV`), so training cells take their short
budget, as in the grader's kernels (the checks do not depend on how long a model trained), and it waits for the
kernel in slices like every other notebook run of the course (:mod:`autograder.kernel_client`).
"""

from __future__ import annotations

import os
from typing import Any

from autograder.kernel_client import SlicedKernelManager
from solutions.notebook import QUICK_ENV


class ValidateKernelManager(SlicedKernelManager):
    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        kw["env"] = {**(kw.get("env") or os.environ), QUICK_ENV: "1"}
        return await super()._async_pre_start_kernel(**kw)
