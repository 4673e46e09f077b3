"""All configuration in one place: environment variables with the HARNESS_ prefix."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESS_", extra="ignore")

    data_dir: Path = Field(
        default=Path.home() / ".local" / "share" / "kernelharness",
        description="Build cache, per-job logs and the SQLite file live here.",
    )
    scratch_dir: Path | None = Field(
        default=None,
        description="Where evaluation temp dirs (inputs/outputs exchanged between processes) are made; "
        "system temp dir when unset.",
    )
    problems_dir: Path | None = Field(
        default=None, description="An external KernelBench-format folder to load problems from."
    )
    build_cache_dir: Path | None = Field(
        default=None, description="The load_inline build cache (content-addressed, each build dir locked while in "
        "use), which the workers of one host may share; unset: <data_dir>/builds.",
    )

    # Correctness
    correctness_trials: int = Field(default=5, ge=1, le=100)

    # Timing: rounds of windows on the parent's clock (harness/evaluation/windows.py), candidate and reference
    # interleaved; each window lasts about window_ms at the reference's speed. On CUDA 12 rounds: a median of 12
    # windows is about 12% noisier than one of 15 (sqrt(15/12)) for 0.75 s less an evaluation (README, phase table).
    # The speedup is paired by round (windows.paired_ratio): the median over n rounds of log ratios whose spread
    # (interquartile range) is s is known to about 2 s / sqrt(n) (95%): at a 5% spread, 12 rounds leave +-3.0%. So 12
    # on the CPU too. These are the most; the rounds end after timing_windows_least once the speedup is known to
    # timing_known_to (windows.paired_halfwidth): the built-in problems' windows on an H200 spread 0.1-1.5%, and 6
    # rounds of 0.5% know their ratio to 0.5%.
    timing_windows_cuda: int = Field(default=12, ge=3)
    timing_windows_cpu: int = Field(default=12, ge=3)
    timing_windows_least: int = Field(
        default=6, ge=3,
        description="The fewest timed rounds: after these the rounds end once the candidate's time over each "
                    "baseline's is known to timing_known_to, and run on up to timing_windows_cuda/_cpu where the "
                    "windows disagree (and timing_windows_extra_cuda/_cpu more, see timing_rank_known_to).",
    )
    timing_known_to: float = Field(
        default=0.01, ge=0,
        description="What the candidate's time over each baseline's must be known to (95%, relative) for the timed "
                    "rounds to end before their most; 0 runs every round.",
    )
    # A ratio not yet known to timing_rank_known_to after those rounds runs on, up to timing_windows_extra_cuda/_cpu
    # more: on an H100 (464ddf9) level3/15's A/A came out at 1.051x, unmarked, its paired spread 7.1% known to +-4.5%
    # after 12 rounds; 24 know such a spread to +-2.8%. A spread over the ranking limit (grading.SPREAD_LIMIT, 10%)
    # still marks the result however many rounds ran. None extra on the CPU, whose A/A is within +-5% at 12 (README)
    # and whose windows are most of a CPU test suite's time.
    timing_rank_known_to: float = Field(
        default=0.03, ge=0,
        description="What the candidate's time over each baseline's should be known to (95%, relative) once "
                    "timing_windows_cuda/_cpu rounds have run; where it is not, extra rounds run until it is.",
    )
    timing_windows_extra_cuda: int = Field(default=24, ge=0)
    timing_windows_extra_cpu: int = Field(default=0, ge=0)
    timing_warmup_rounds: int = Field(
        default=2, ge=1,
        description="Untimed rounds of every kind's windows before the timed ones (lazy initialisation, autotuning, "
                    "torch.compile's first calls; the windows sized again after each).",
    )
    timing_warmup_settle_rounds: int = Field(
        default=4, ge=0,
        description="Further untimed rounds, at most, while the candidate's or eager's last warm-up window was "
                    "still faster a call than the one before (rounds.SETTLED): windows are sized on calls that "
                    "have settled.",
    )
    timing_retime_sized_down: bool = Field(
        default=True,
        description="Timed windows sized down on the candidate's untimed ones that then lasted under half their "
                    "target are taken as one more warm-up, and the timed rounds run once more on windows sized on "
                    "them; off: such a result is marked timing_unreliable at once.",
    )
    window_ms_cuda: float = Field(default=60.0, gt=0)
    window_ms_cpu: float = Field(default=60.0, gt=0)
    window_fixed_cost_factor: float = Field(
        default=100.0, ge=0,
        description="A window's net work outweighs its constant cost (a command's round trip, measured before the "
                    "rounds) this many times, whatever window_ms says (windows.resize); 0 leaves window_ms alone.",
    )
    window_inputs_staged_cuda: bool = Field(
        default=False,
        description="On CUDA, the trusted side makes each timed window's inputs before it, while the candidate is "
                    "paused, and shares them through the window segment; each window follows an untimed lead-in "
                    "(window_lead_in_ms). Off: each process makes its inputs inside its windows.",
    )
    window_inputs_staged_cpu: bool = Field(
        default=True,
        description="The same on the CPU. With eager's windows in a process of its own (eager_process_cpu), each "
                    "process with a window segment of its own, 60 of 60 A/A runs of the built-ins came out within "
                    "+-5% and unmarked on the idle 2-core CPU VM, against 56 of 60 (README, Timing on the CPU).",
    )
    eager_process_cuda: str = Field(
        default="own", pattern="^(own|trusted)$",
        description="Where eager's windows run on CUDA: 'own', a process of their own started as the candidate's is "
                    "(the reference as a submission: the same child, jail, pauses and wakes; rounds.TimedRounds), "
                    "where the memory plan leaves room for it; 'trusted', the trusted process that judges.",
    )
    eager_process_cpu: str = Field(
        default="own", pattern="^(own|trusted)$",
        description="Where eager's windows run on the CPU: 'own' or 'trusted' (eager_process_cuda).",
    )
    window_lead_in_ms: float = Field(
        default=10.0, ge=0,
        description="Untimed calls of about this long in the same process right before each timed window, where the "
                    "windows' inputs are staged (rounds.RoundsPlan): a window that starts after its process waited "
                    "ran up to half slower on an H100 for networks of many small kernels; 0: none.",
    )
    timing_core: str = Field(
        default="auto", pattern="^(auto|off|[0-9]+)$",
        description="The CPU core both sides' window threads are kept to for the timed rounds (their kernels' "
                    "launches then run on one core, whatever the host does to the others): 'auto' takes, on CUDA "
                    "only, one of the worker's cores by the evaluation's GPU (its last for GPU 0, the one before "
                    "for GPU 1, ...); a number names it; 'off' leaves the threads where the system puts them.",
    )
    busy_core: str = Field(
        default="off", pattern="^(auto|off|[0-9]+)$",
        description="A core kept busy (a spinner at the idle scheduling class) through the timed rounds "
                    "(harness/evaluation/busy_core.py): 'auto' takes, on CUDA where a timing core is kept and the "
                    "worker has 4 cores or more, its first core that no slot's windows take; a number names it; "
                    "'off', the default, keeps none (on an H200 host it made launch-bound windows faster outside the "
                    "harness and left level 3's spread inside it as it was: docs/kernelbench.md).",
    )
    compile_baseline: str = Field(
        default="auto", pattern="^(auto|on|off)$",
        description="Time torch.compile of the reference too; 'auto' does so on CUDA only.",
    )
    gpu_idle_wait_s: float = Field(
        default=10.0, ge=0,
        description="Before each reference window on CUDA the trusted side waits, up to this long, until a probe "
                    "kernel says no other process's work is queued on the GPU (what a candidate left running would "
                    "slow the reference); 0 turns the wait off, for evaluations that share a GPU on purpose.",
    )
    prestart_candidates: str = Field(
        default="auto", pattern="^(auto|on|off)$",
        description="A worker's slot starts the next job's candidate process (torch imported, no submission code) "
                    "while it evaluates the current one; 'auto' does so on GPU slots only: on a CPU slot the start "
                    "would share the cores the current evaluation is timed on.",
    )
    prestart_depth: int = Field(
        default=2, ge=1,
        description="How many of the next jobs' candidate processes a slot that starts them ahead keeps started: "
                    "a process's start (Python, torch, its CUDA context) can outlast a warm evaluation, and with one "
                    "ahead 3 of 7 warm level2/75 evaluations on an H200 waited 0.9-1.5 s for theirs.",
    )
    warm_trusted_per_slot: int = Field(
        default=6, ge=1,
        description="Warm trusted processes a slot keeps, one per problem, size and device, the least recently used "
                    "ended beyond: a batch mixing problems finds each warm again. Each waiting one holds its CUDA "
                    "context and its Model (not its outputs) on the slot's GPU.",
    )
    ready_bypass_limit: int = Field(
        default=8, ge=0,
        description="A worker's slot takes a ready job of the problem it evaluates (its trusted process warm for "
                    "it) ahead of older ready jobs, each of which it passes over at most this many times (a warm "
                    "evaluation is several times faster than a cold one); 0: first in, first out.",
    )

    # Deadlines the parent enforces (seconds). Problem specs may raise compile/run limits.
    reference_timeout_s: float = 600.0
    kill_grace_s: float = 3.0
    # A submission's import may take its problem's compile limit while a compiler runs (load_inline builds), and
    # this long past the last moment one ran: an import that hangs costs seconds, not the compile limit.
    import_idle_timeout_s: float = Field(default=90.0, gt=0)

    # Device memory (evaluation/memory_plan.py): what an evaluation may use of its GPU.
    device_memory_budget_mb: int = Field(
        default=0, ge=0, description="At most this much device memory for one evaluation (both processes), below "
        "the device's free memory: for a GPU shared with other work (and for tests, on the host too); 0: the "
        "device's free memory alone.")
    device_memory_reserve_mb: int = Field(
        default=2048, ge=0, description="Device memory the memory plan keeps spare for what it does not count (the "
        "candidate's CUDA context, cuBLAS and cuDNN workspaces, the allocator's rounding): a margin, not a "
        "measurement.")
    exchange_memory: Literal["auto", "host", "device"] = Field(
        default="auto", description="Where trial data between the two processes lives on CUDA (evaluation/"
        "exchange.py): host, shared memfds (the candidate copies to and from the device); device, device memory of "
        "the driver's VMM API; auto, device where a probe (evaluation/exchange_probe.py) showed it crosses the "
        "sandbox on this host, else host. On CPU always host.")

    # Build cache
    build_cache: bool = Field(default=True, description="Reuse load_inline builds keyed by source hash.")
    build_cache_max_mb: int = Field(default=50_000, ge=0, description="A worker removes the least recently used "
                                    "build dirs beyond this size; 0: no bound.")

    # Service: database
    database_url: str | None = Field(
        default=None, description="Any SQLAlchemy URL; unset, the SQLite file <data_dir>/harness.db (WAL mode).",
    )
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0,
                                        description="How long a SQLite writer waits for the lock before failing.")
    db_pool_size: int = Field(default=5, ge=1, description="Database connections a process keeps open.")
    db_pool_overflow: int = Field(default=10, ge=0, description="Connections a process may open beyond "
                                  "db_pool_size when busy; the API handles at most the two together at once.")

    # Service: API
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    open_mode: bool = Field(
        default=False, description="Accept submissions without a token (local single-user use; loopback only). "
        "Re-evaluation and deletion still need an admin token.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Larger request bodies get 413.")
    max_queued_per_token: int = Field(default=100, ge=1,
                                      description="Unfinished submissions one token may have; admins are exempt.")

    # Service: queue and workers
    lease_s: float = Field(default=120.0, gt=0,
                           description="A claimed job whose worker sends no heartbeat for this long is requeued.")
    heartbeat_s: float = Field(default=10.0, gt=0, description="How often a worker renews its leases and reports "
                               "itself alive (at most a quarter of lease_s); silent for 3 of these, it is no longer "
                               "listed as live, and its jobs' pages say so.")
    max_attempts: int = Field(default=3, ge=1, description="Evaluations of one job before infra_error is final.")
    retry_delay_s: float = Field(default=10.0, ge=0, description="Wait before retrying a job after an infra_error.")
    worker_poll_s: float = Field(default=1.0, gt=0, description="How often an idle worker looks for jobs.")
    compile_workers: int | None = Field(
        default=None, ge=0, description="Threads precompiling queued submissions ahead of the GPU slots; "
        "unset: half the CPU cores (up to 8) on a GPU worker, 0 on a CPU-only one.",
    )

    # Sandbox: how children are confined (see docs/security.md)
    sandbox_user: str = Field(default="auto", pattern="^(auto|off)$",
                              description="auto: as root, children running submissions get a sandbox uid each.")
    sandbox_uid_base: int = Field(default=990_000, ge=1000,
                                  description="First of the sandbox uids (no passwd entry needed).")
    sandbox_uid_count: int = Field(default=64, ge=1,
                                   description="Sandbox uids: at most this many untrusted children at once.")
    sandbox_network: str = Field(default="auto", pattern="^(auto|off)$",
                                 description="auto: every child gets a new network namespace (no network at all).")
    allow_unsafe_sandbox: bool = Field(default=False, description="Let a worker run although the platform cannot "
                                       "isolate the network or (as root) switch users.")
    child_memory_mb: int = Field(default=65_536, ge=0, description="Host memory per child (cgroup); 0: no limit.")
    child_max_pids: int = Field(default=2048, ge=16,
                                description="Processes and threads per child (cgroup, RLIMIT_NPROC).")
    child_open_files: int = Field(default=4096, ge=64, description="RLIMIT_NOFILE per child.")
    child_file_mb: int = Field(default=16_384, ge=0,
                               description="Largest file a candidate's process may write (RLIMIT_FSIZE): one output "
                               "of the problem must fit (KernelBench's level3/17 at its own size: 4.3 GB); 0: none.")
    child_cpu_s: int = Field(default=7200, ge=0, description="CPU seconds per child process (RLIMIT_CPU); 0: none.")
    child_disk_mb: int = Field(default=8192, ge=0, description="Disk a child may fill in its home and build dir; "
                               "the parent kills it beyond; 0: no limit.")
    child_disk_files: int = Field(default=100_000, ge=0, description="Files and dirs a child may make in its home "
                                  "and build dir (an empty file takes an inode, which child_disk_mb does not bound); "
                                  "the parent kills it beyond; 0: no limit.")
    child_log_mb: int = Field(default=256, ge=0, description="What a candidate's process may write to its log (its "
                              "stdout and stderr, which the harness writes to its own disk on its behalf); the parent "
                              "kills it beyond; 0: no limit.")
    min_free_disk_mb: int = Field(default=1024, ge=0, description="A worker evaluates nothing while the data or "
                                  "scratch disk has less free space (infra_error, retried).")

    @field_validator("data_dir", "scratch_dir", "problems_dir", "build_cache_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Children run in temp dirs of their own: a relative path must not reach them as such."""
        return None if path is None else path.expanduser().resolve()

    @property
    def builds_dir(self) -> Path:
        return self.build_cache_dir or self.data_dir / "builds"

    @property
    def heartbeat_interval_s(self) -> float:
        # Several beats fit in one lease, or a lease could expire between two of them.
        return max(0.2, min(self.heartbeat_s, self.lease_s / 4))

    @property
    def worker_silent_after_s(self) -> float:
        """A worker with no heartbeat for this long has missed several: it is shown as silent (not live)."""
        return 3 * self.heartbeat_interval_s

    def windows_staged(self, device: str) -> bool:
        """Whether the timed windows' inputs are staged on `device` (cuda | cpu)."""
        return self.window_inputs_staged_cuda if device == "cuda" else self.window_inputs_staged_cpu


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
