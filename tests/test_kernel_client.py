"""The kernel client used to execute notebooks reads a reply whose zmq wake-up was lost, within a slice.

The stock asyncio channel, given the same lost wake-up, returns the message only when its whole
timeout has passed (a chapter's cell held for nbclient's 600 s in a test run); reading
``zmq.EVENTS`` after the message arrives consumes the edge-triggered wake-up, as happened there.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from queue import Empty

import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import Session
from nbclient import NotebookClient
from support import run_coroutine
from traitlets.config import Config

from autograder import kernel_client
from autograder.kernel_client import (
    SlicedChannel,
    SlicedKernelClient,
    SlicedKernelManager,
)


async def _wait(channel_class, timeout: float, send: bool, name: str) -> tuple[float, object]:
    ctx = zmq.asyncio.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind(f"inproc://{name}")
    b.connect(f"inproc://{name}")
    session = Session()
    channel = channel_class(b, session)

    async def reply_then_lose_the_wake_up():
        await asyncio.sleep(0.2)
        session.send(a, "execute_reply", {"status": "ok"})
        b.getsockopt(zmq.EVENTS)

    if send:
        task = asyncio.ensure_future(reply_then_lose_the_wake_up())
    start = time.monotonic()
    try:
        result = await channel.get_msg(timeout=timeout)
    except Empty as e:
        result = e
    elapsed = time.monotonic() - start
    if send:
        await task
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()
    return elapsed, result


def test_a_reply_whose_wake_up_was_lost_is_read_within_a_slice_not_at_the_timeout():
    elapsed, msg = run_coroutine(_wait(SlicedChannel, timeout=60, send=True, name="lost"))
    assert isinstance(msg, dict) and msg["msg_type"] == "execute_reply", msg
    assert elapsed < kernel_client.SLICE + 10, f"{elapsed:.1f} s: the reply waited for the timeout"


def test_no_reply_still_times_out_at_the_deadline_not_before():
    elapsed, result = run_coroutine(_wait(SlicedChannel, timeout=2.5, send=False, name="none"))
    assert isinstance(result, Empty)
    assert 2.4 < elapsed < 20, elapsed


def test_nbclient_and_nbgrader_use_the_sliced_client():
    assert NotebookClient(nb=None, kernel_manager_class=SlicedKernelManager).kernel_manager_class is SlicedKernelManager
    assert isinstance(SlicedKernelManager().client(), SlicedKernelClient)
    config = Config()
    source = (Path(kernel_client.__file__).parent / "nbgrader_config.py").read_text()
    exec(compile(source, "nbgrader_config.py", "exec"), {"c": config, "get_config": lambda: config})  # noqa: S102
    assert config.Execute.kernel_manager_class == "autograder.kernel_client.SlicedKernelManager"


@pytest.mark.parametrize("channel", ["shell_channel_class", "iopub_channel_class", "stdin_channel_class",
                                     "control_channel_class"])
def test_every_message_channel_is_sliced(channel):
    assert getattr(SlicedKernelClient, channel).default_value is SlicedChannel
