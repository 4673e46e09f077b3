"""The parent's handles on its two children: send a command, wait for its reply, on the parent's clock. No torch.

The trusted child is the harness's own code: its failure is the harness's (`TrustedFailed`, infra_error).
The candidate's process is the submission's: the parent takes from it only the reply the command it sent
names, carrying that command's nonce, before the command's deadline. Anything else (a message out of turn,
a reply to no command, silence, an exit) stops the evaluation there with the reason in `obs`
(`CandidateStopped`); nothing it says is a figure the parent believes.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import kernels
from harness.evaluation.protocol import REPLIES, REPLY_MODELS, CandidateCommand, Import, LaunchedMessage, Window
from harness.sandbox import stacks
from harness.sandbox.capabilities import SandboxError
from harness.sandbox.pause import PausedMark, PauseFailed
from harness.sandbox.process import ChildExited, ChildProcess, Deadline, Message, describe_returncode
from harness.schema import (
    ChildError,
    ChildExit,
    FlagChange,
    GpuMemoryAtFailure,
    KernelLaunch,
    KernelTrace,
    Observations,
)
from harness.verdicts import Phase, device_out_of_memory


class TrustedFailed(Exception):
    pass


class Trusted:
    """The trusted child: `call` sends a command and returns its reply's fields and the parent's clock around it."""

    def __init__(self, proc: ChildProcess, timeout_s: float):
        self.proc = proc
        self.timeout_s = timeout_s
        self.pending: tuple[str | None, float, float] = (None, 0.0, 0.0)  # command, deadline, limit
        self.sent_at = 0.0
        self.in_sync = True  # every command sent has had its reply: the process can serve another evaluation
        self.pausable = True  # until a pause fails: the host cannot pause it (the candidate's pause says why)

    def processes(self) -> list[int]:
        """The trusted side's processes (host PIDs, as the parent sees them)."""
        return self.proc.processes()

    def call(self, command: dict[str, Any], reply: str, timeout_s: float | None = None) -> dict[str, Any]:
        self.send(command, timeout_s)
        return self.wait(reply).fields

    def pause(self) -> str | None:
        """Pause it as the candidate is paused between its turns (its next command continues it, on that command's
        clock): a staged window of either side then starts the same way. How it is held ("cgroup_freeze",
        "ptrace", ...), or None where this host cannot."""
        if not self.pausable:
            return None
        try:
            self.proc.pause()
        except PauseFailed:
            self.proc.resume()
            self.pausable = False
            return None
        return self.proc.pause_method

    def timed_call(self, command: dict[str, Any], reply: str, timeout_s: float | None = None
                   ) -> tuple[float, dict[str, Any]]:
        """Milliseconds on the parent's clock from sending the command to receiving its reply; the reply's fields."""
        self.send(command, timeout_s)
        msg = self.wait(reply)
        return (msg.received_at - self.sent_at) * 1e3, msg.fields

    def send(self, command: dict[str, Any], timeout_s: float | None = None) -> None:
        """Send a command without waiting for its answer (`wait` collects it); its time limit starts now."""
        limit = timeout_s or self.timeout_s
        text = json.dumps(command, default=str)  # before the clock starts, as for the candidate's commands
        self.in_sync = False
        self.sent_at = time.monotonic()
        self.pending = (command.get("cmd"), self.sent_at + limit, limit)
        self.proc.send(text)

    def wait(self, reply: str, final: bool = True) -> Message:
        """The answer to the command last sent; with `final=False`, a message it sends on the way (the command is
        still running)."""
        cmd, deadline, limit = self.pending
        try:
            while True:
                msg = self.proc.next_message(deadline)
                if msg.event == reply:
                    self.in_sync = final
                    return msg
                if msg.event == "failed":
                    raise TrustedFailed(msg.fields.get("traceback") or msg.fields.get("error", "unknown failure"))
        except Deadline:
            raise TrustedFailed(f"no answer to {cmd!r} within {limit:g} s") from None
        except ChildExited:
            code = self.proc.wait_exit(5)
            raise TrustedFailed(
                f"the trusted process ended (code {code}) during {cmd!r}:\n{self.proc.log_tail()}"
            ) from None


def add_trusted_seconds(obs: Observations, command: str, reply: dict[str, Any]) -> None:
    """Add a trusted reply's own step timings to `obs.trusted_seconds` (diagnostics)."""
    for step, secs in (reply.get("seconds") or {}).items():
        name = f"{command}.{step}"
        obs.trusted_seconds[name] = round(obs.trusted_seconds.get(name, 0.0) + float(secs), 4)


class CandidateStopped(Exception):
    """The candidate's process goes no further; `obs` says why."""


class _Poll(Exception):
    """A wait for the candidate's import ended a poll interval with no message: look at its compilers again."""


IMPORT_POLL_S = 1.0
MAX_LAUNCHES = 1000  # distinct kernels a traced window may report: a real forward launches tens


class Candidate:
    """The candidate's process, driven command by command. `finish` always ends it and records how it ended."""

    def __init__(self, proc: ChildProcess, obs: Observations, builds: Path, release_build: contextlib.ExitStack,
                 kill_grace_s: float, source: str = ""):
        self.proc, self.obs, self.builds, self.source = proc, obs, builds, source
        self.release_build = release_build
        self.kill_grace_s = kill_grace_s
        self.exit = ChildExit(phase=Phase.compile)
        self.dismissed = False  # stopped by the harness before it constructed anything (invalid constructor)
        self.ended = False  # `finish` has run
        self.channel_closed = False
        self.sent_at = 0.0
        self.import_command: Import | None = None
        # The evaluation's GPU's memory now, whose it is (gpu_sharing.memory_at_failure); set by the runner on CUDA,
        # read the moment the candidate reports running out of device memory.
        self.device_memory: Callable[[], GpuMemoryAtFailure] | None = None

    def begin_import(self) -> None:
        """Tell the process to import the submission (it may have been started ahead, holding torch only)."""
        self.import_command = Import()
        text = self.import_command.model_dump_json()
        self.sent_at = time.monotonic()
        try:
            self.proc.send(text)
        except ChildExited:
            self.channel_closed = True

    def await_imported(self, limit_s: float, idle_limit_s: float) -> Message:
        """The reply to `begin_import`, 'imported', within the compile limit counted from that command; and, so that
        an import that hangs costs seconds rather than the compile limit, within `idle_limit_s` of the last moment
        a compiler ran in its session (or of the command)."""
        assert self.import_command is not None, "begin_import first"
        self.exit.deadline_s = limit_s
        if self.channel_closed:
            raise CandidateStopped
        asked_at = self.sent_at
        deadline = asked_at + limit_s
        busy_at = asked_at
        while True:
            now = time.monotonic()
            if self.proc.compiling():
                busy_at = now
            elif now - busy_at > idle_limit_s:
                self.exit.timed_out, self.exit.idle_s = True, round(now - busy_at, 1)
                raise CandidateStopped
            try:
                msg = self._next(min(deadline, now + IMPORT_POLL_S), final=now + IMPORT_POLL_S >= deadline)
            except _Poll:
                continue
            break
        if msg.event != "imported":
            self._violation(f"{msg.event!r} where 'imported' was due")
        if msg.fields.get("nonce") != self.import_command.nonce:
            self._violation("an 'imported' that answers no command the harness sent (wrong nonce)")
        self._note_flags(msg.fields)
        # From the command (at the process's start, unless it was started ahead): the interpreter's and torch's
        # import are in it only where the evaluation waited for them.
        self.obs.candidate_import_s = msg.received_at - asked_at
        return msg

    def request(self, command: CandidateCommand, limit_s: float, phase: Phase, clock_from_resume: bool = False
                ) -> Message:
        """Send `command`; its reply (with its nonce) within `limit_s` on the parent's clock, else CandidateStopped.
        The reply's `received_at` less `sent_at` is the command's time. Paused since its last turn, the process is
        continued before the clock starts; with `clock_from_resume`, after (a window whose inputs wait in memory it
        maps: not a moment of it runs off the clock)."""
        self.exit.phase, self.exit.deadline_s = phase, limit_s
        text = command.model_dump_json()  # before the clock starts: a window's time is the child's, not pydantic's
        if clock_from_resume:
            self.sent_at = time.monotonic()
            self.proc.resume()
        else:
            self.proc.resume()
            self.sent_at = time.monotonic()
        try:
            self.proc.send(text)
        except ChildExited:
            self.channel_closed = True
            raise CandidateStopped from None
        want = REPLIES[command.cmd]
        msg = self._next(self.sent_at + limit_s)
        while msg.event == "launched" and isinstance(command, Window) and command.trace:
            self._launched(msg.fields)
            msg = self._next(self.sent_at + limit_s)
        if msg.event == "invalid" and command.cmd == "construct" and msg.fields.get("nonce") == command.nonce:
            self.obs.static_error = str(msg.fields.get("message", "ModelNew cannot be constructed"))
            self.exit.finished = True
            raise CandidateStopped
        if msg.event != want:
            self._violation(f"{msg.event!r} where the reply to {command.cmd!r} was due")
        if msg.fields.get("nonce") != command.nonce:
            self._violation(f"a {want!r} that answers no command the harness sent (wrong nonce)")
        self._note_flags(msg.fields)
        if want in REPLY_MODELS:
            try:
                REPLY_MODELS[want].model_validate(msg.fields)
            except ValidationError as e:
                self._violation(f"a malformed {want!r}: {str(e).splitlines()[0]}; "
                                f"{'; '.join(str(x['loc']) + ' ' + x['msg'] for x in e.errors()[:3])}")
        return msg

    def pause(self) -> None:
        """Its turn is over: its processes stay paused until the harness's next command (ChildProcess.pause). A pause it
        made impossible stops the evaluation there (its failure); one the host cannot give is SandboxError."""
        try:
            self.proc.pause()
        except PauseFailed as e:
            if e.harness:
                raise SandboxError(f"the candidate cannot be paused on this host: {e}") from e
            self.obs.pause_error = str(e)
            raise CandidateStopped from None
        self.obs.pause_method = self.proc.pause_method

    def can_keep_to(self) -> bool:
        """Whether its jail has a cpuset that `keep_to` can hold it by."""
        return self.proc.jail is not None and self.proc.jail.cpuset is not None

    def keep_to(self, cores: list[int] | None) -> bool:
        """Hold all its processes to `cores` (None: every core of the worker's again), by its jail's cpuset: whatever
        it asks of the scheduler. False where the host gives no cpuset (or no jail)."""
        jail = self.proc.jail
        return jail is not None and jail.keep_to(cores)

    def processes(self) -> list[int]:
        """Every process of the candidate's now, one that left its process group too (host PIDs, as the parent sees
        them)."""
        return self.proc.processes()

    def cpu_mark(self) -> PausedMark | None:
        """Its CPU clock, while it is paused (None otherwise): `cpu_used_us` says what it used since, `cpu_users`
        which of its threads."""
        return self.proc.cpu_mark()

    def cpu_used_us(self, mark: PausedMark | None) -> int:
        return self.proc.cpu_used_us(mark)

    def cpu_users(self, mark: PausedMark, used_us: int) -> str:
        return self.proc.cpu_users(mark, used_us)

    def stop(self) -> None:
        """The harness ends the conversation (done, or the candidate failed a gate): the process should exit."""
        self.exit.finished = True
        with contextlib.suppress(ChildExited):
            self.proc.send("exit")

    def finish(self) -> None:
        """End the process (its whole group), release the build dir, record how it ended. Idempotent."""
        if self.ended:
            return
        self.ended = True
        if self.exit.finished or self.channel_closed:
            self.proc.wait_exit(self.kill_grace_s + 10)  # the pipe closes a moment before the process is reapable
        elif self.exit.timed_out and self.proc.proc.poll() is None:
            limit = f"idle {self.exit.idle_s:g} s with no compiler running" if self.exit.idle_s is not None else \
                f"past its {self.exit.deadline_s:g} s limit" if self.exit.deadline_s else "past its limit"
            stacks.dump(self.proc, f"the {self.exit.phase.value} phase timed out ({limit})")
        self.proc.kill()
        code = self.proc.proc.returncode
        self.exit.returncode = code
        self.exit.signal = None if self.exit.finished else describe_returncode(code)
        at_end = None if self.proc.limit_exceeded else self.proc.count_disk_at_end()
        if self.proc.limit_exceeded:  # killed for a resource limit: that is why, whatever it did after
            self.exit.signal = f"{self.exit.signal or 'a signal'} from the harness for its {self.proc.limit_exceeded}"
        elif at_end:  # over its share between the watcher's counts: the same verdict
            self.exit.finished = False
            self.exit.signal = f"the harness, counted at its end, for its {at_end}"
        elif self.proc.killed_by_parent and not self.exit.timed_out and not self.exit.finished:
            self.exit.signal = f"{self.exit.signal or 'a signal'} from the harness (it closed its channel but did " \
                               "not exit)"
        self.proc.reap()
        self.release_build.close()
        extra = self.proc.drain()
        if extra and self.exit.finished and not self.obs.protocol_violations and self.obs.candidate_error is None:
            self.obs.protocol_violations.append(f"{len(extra)} message(s) that answer no command (the first: "
                                                f"{extra[0].event!r})")
        if self.dismissed:
            return
        if self.proc.garbage_lines:
            self.obs.protocol_violations.append(f"{self.proc.garbage_lines} line(s) on the channel that are not "
                                                "harness messages")
        self.obs.candidate_exit = self.exit
        self.obs.log_tail = self.proc.log_tail()
        trace = self.obs.kernels
        if trace is not None and not trace.from_source:
            trace.custom = kernels.custom_kernels(trace.launches, kernels.device_kernels(self.builds), self.source,
                                                  trace.own_triton, trace.own_build)

    def begin_trace(self, window: int) -> None:
        """The timed round whose window is traced: its launches arrive with it (`_launched`)."""
        self.obs.kernels = KernelTrace(names=[], window=window)

    def _launched(self, fields: dict[str, Any]) -> None:
        """A kernel the traced window launched, as it happened: a claim, which credits only what the submission's
        build or its own `@triton.jit` text defines (kernels.custom_kernels)."""
        trace = self.obs.kernels
        assert trace is not None and trace.names is not None, "begin_trace first"
        try:
            m = LaunchedMessage.model_validate(fields)
        except ValidationError as e:
            self._violation(f"a malformed 'launched': {str(e).splitlines()[0]}")
        if m.error:
            trace.error = m.error[:500]
        trace.graph = trace.graph or m.graph
        if m.name is not None and len(trace.launches) < MAX_LAUNCHES:
            trace.launches.append(KernelLaunch(name=m.name[:2000], handle=m.handle))
            if m.name not in trace.names:
                trace.names.append(m.name[:2000])

    def record_trace(self, fields: dict[str, Any]) -> None:
        """The Trace command's reply: the handles of the kernels its build and its own @triton.jit functions define."""
        if self.obs.kernels is not None:
            for key in ("own_triton", "own_build"):
                setattr(self.obs.kernels, key, {str(k)[:2000]: v[:1000] for k, v in
                                                list((fields.get(key) or {}).items())[:MAX_LAUNCHES]})

    def _next(self, deadline: float, final: bool = True) -> Message:
        """The next message before `deadline`; an 'error' (the submission raised) ends the conversation. With
        `final` False, a deadline passed is only the end of a poll (`_Poll`)."""
        try:
            msg = self.proc.next_message(deadline)
        except Deadline:
            if not final:
                raise _Poll from None
            self.exit.timed_out = True
            raise CandidateStopped from None
        except ChildExited:
            self.channel_closed = True
            raise CandidateStopped from None
        if msg.event == "error":
            try:
                err = self.obs.candidate_error = ChildError.model_validate(msg.fields)
            except ValidationError as e:
                self._violation(f"a malformed 'error' message: {e}")
            if self.device_memory is not None and device_out_of_memory(err.exc_type, err.message) is not None:
                self.obs.gpu_memory_at_failure = self.device_memory()
            # An honest process keeps what it holds until this word (child.run), so NVML was read with its memory.
            with contextlib.suppress(ChildExited):
                self.proc.send("exit")
            self.exit.finished = True
            raise CandidateStopped
        return msg

    def _note_flags(self, fields: dict[str, Any]) -> None:
        """Global torch settings the candidate's process says it found changed: a claim only against itself."""
        try:
            changes = [FlagChange.model_validate(c) for c in fields.get("flag_changes") or []]
        except ValidationError as e:
            self._violation(f"malformed flag changes: {e}")
        known = {(c.name, c.when) for c in self.obs.flag_changes}
        self.obs.flag_changes += [c for c in changes if (c.name, c.when) not in known]

    def _violation(self, what: str) -> None:
        self.obs.protocol_violations.append(what)
        raise CandidateStopped

