"""A DyNet worker kept running (``dynet_peer.py --serve``) and timed one mini-batch at a time.

DyNet fixes its autobatch mode at import, so each mode lives in its own process. Run once per
mode before or after the edbatch passes, a DyNet row sees the machine of another minute; on
a VM whose speed drifts by tens of percent within minutes that moves the ratios more than
any change under test. Kept running, the worker answers one mini-batch pass per request, and
the throughput harness interleaves those passes with edbatch's (same repeats, same order of
mini-batches, per-mini-batch medians), so every contender is timed in the same minutes. The
harness waits on the reply while the worker runs: the two never compete for a core.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["DynetServer", "PeerServerError"]


class PeerServerError(RuntimeError):
    """The worker died, never became ready, or refused a request (the message says which)."""


class DynetServer:
    """``dynet_peer.py --serve`` as a subprocess; :meth:`run` times one mini-batch pass.

    Args:
        cmd: the worker's command line (with ``--serve``).
        env: its environment.
        cwd: its working directory.
    """

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str], cwd: str | Path) -> None:
        #: How the worker was started (the memory probe starts variants of it).
        self.cmd, self.env, self.cwd = list(cmd), dict(env), cwd
        self._err: IO[str] = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True, cwd=cwd, env=dict(env))
        try:
            hello = self._reply()
            if not hello.get("ready"):
                raise PeerServerError(f"worker did not report ready: {hello}")
        except PeerServerError:
            self.close()  # the pipes and the stderr file, also when the worker died
            raise
        self.contender: str = hello["contender"]
        self.sizes: list[int] = hello["sizes"]
        #: The worker's resident set (MB) when it became ready (its peak RSS is reported
        #: with every pass as ``maxrss_mb``).
        self.ready_rss_mb: float = float(hello.get("rss_mb", float("nan")))

    def _stderr_tail(self) -> str:
        self._err.seek(0)
        return self._err.read().strip()[-600:]

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.lstrip().startswith("{"):
                try:
                    return dict(json.loads(line))
                except json.JSONDecodeError:
                    pass  # not one of ours: DyNet may write to stdout too
        code = self.proc.wait()
        raise PeerServerError(f"worker exited {code}: {self._stderr_tail()}")

    def run(self, mode: str, batch: int, indices: Sequence[int] | None = None,
            split: str | None = None) -> tuple[dict[str, float], float]:
        """Time mini-batch ``batch`` in ``mode`` (or, with ``indices``, the instances
        ``indices`` of ``split``): (phase seconds, loss)."""
        assert self.proc.stdin is not None
        req: dict[str, Any] = {"mode": mode, "batch": batch}
        if indices is not None:
            req.update(indices=[int(i) for i in indices], split=split)
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            code = self.proc.wait()
            raise PeerServerError(f"worker exited {code}: {self._stderr_tail()}") from None
        reply = self._reply()
        if "error" in reply:
            raise PeerServerError(str(reply["error"]))
        loss = float(reply.pop("loss"))
        return {k: float(v) for k, v in reply.items()}, loss

    def close(self) -> None:
        """End the worker (end of input) and wait for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()

    def __enter__(self) -> DynetServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
