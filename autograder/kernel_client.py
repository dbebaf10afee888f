"""A kernel manager for nbclient and nbgrader whose waits for a kernel's message cannot miss it.

jupyter_client's asyncio channels wait on the zmq socket's file descriptor, which is
edge-triggered: when its wake-up is lost, the reply that has arrived is only read when the wait
times out (pyzmq's poller makes one last non-blocking poll then). A cell that ran in 10 s was
then reported after nbclient's whole cell timeout, 600 s (seen once in three full test runs
executing a chapter with nbclient; both processes idle in epoll meanwhile). Here every wait is
made of waits of at most ``SLICE`` seconds, each ending with that last poll, so a lost wake-up
costs at most ``SLICE`` seconds and a timeout still ends when it should.

Used by the tests and scripts that execute notebooks with nbclient, and by nbgrader through
``autograder/nbgrader_config.py`` (``ExecutePreprocessor.kernel_manager_class``). The batch
grader does not use jupyter_client.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

SLICE = 1.0  # seconds: the longest a lost wake-up can delay a message


class SlicedChannel(AsyncZMQSocketChannel):
    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:  # type: ignore[override]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE if deadline is None else max(0.0, min(SLICE, deadline - time.monotonic()))
            try:
                return await super().get_msg(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class SlicedKernelClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedChannel)  # type: ignore[assignment]
    iopub_channel_class = Type(SlicedChannel)  # type: ignore[assignment]
    stdin_channel_class = Type(SlicedChannel)  # type: ignore[assignment]
    control_channel_class = Type(SlicedChannel)  # type: ignore[assignment]


class SlicedKernelManager(AsyncKernelManager):
    # both: AsyncKernelManager's client_factory does not follow client_class
    client_class: DottedObjectName = DottedObjectName("autograder.kernel_client.SlicedKernelClient")
    client_factory: Type = Type(SlicedKernelClient, klass=AsyncKernelClient)  # type: ignore[assignment]
