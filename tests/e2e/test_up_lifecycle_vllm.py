"""End to end on real vLLM: `specgate up` stopped the hard way leaves nothing behind.

`specgate up` (two real vLLM CPU servers and the gateway, on free ports) runs
leading a process group of its own, as under a process manager. Once the
gateway is ready, every process below `up` is collected by PID from /proc,
each vLLM API server's engine-core process included. Then SIGKILL to the
group, so `up` can stop nothing itself: within 20 s none of those processes is
alive and the ports are free. (vLLM's engine core does not watch its parent;
were it to leave the launcher's process group, this is the test that fails.)
The fake-backend tests in tests/integration/up/ cover SIGTERM, and SIGTERM
followed by SIGKILL.
"""

from __future__ import annotations

import signal
import time

import pytest

from backends.model import prepare
from backends.ports import check_free
from tests.integration.up import processes
from tests.integration.up.up_process import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

GONE_WITHIN_S = 20.0


def test_sigkill_leaves_no_vllm_process_behind(tmp_path):
    prepare()  # cached outside the checkout; `up` finds it ready
    up = UpProcess(tmp_path).start()
    try:
        up.wait_ready(900)
        procs = up.descendants()
        servers = [p for p in procs if "vllm.entrypoints.openai.api_server" in p.command
                   and "backends.lifeline" not in p.command]
        print(f"{len(procs)} processes below specgate up:", *procs, sep="\n  ")
        assert len(servers) == 2, "\n".join(map(str, procs))
        for server in servers:  # its engine core, forked, titled by vLLM
            assert any(p.ppid == server.pid and "EngineCore" in p.command for p in procs), server

        up.signal_group(signal.SIGKILL)
        killed = time.monotonic()
        left = processes.wait_gone(procs, GONE_WITHIN_S)
        print(f"{len(procs) - len(left)} of {len(procs)} gone {time.monotonic() - killed:.1f} s after SIGKILL")
        assert not left, (f"{len(left)} processes alive {GONE_WITHIN_S:.0f} s after SIGKILL:\n"
                          + "\n".join(map(str, left)))
        for port in (up.port, *up.backend_ports):
            check_free("127.0.0.1", port)
    finally:
        up.kill()
