"""A real two-node Slurm cluster on this machine, for the tests: munged with its own key and socket, slurmctld, and
two slurmd (`slurmd -N node1`, `-N node2`, Debian builds slurm with multiple-slurmd support), every file in one
temporary folder, every port free, torn down at the end.

Both nodes see this machine's disks, except one folder (`hidden`): each slurmd runs in a mount namespace of its own
with an empty tmpfs over it, so a run folder under it is one "only this machine sees" (the refusal tests use it).

    python -m tests.slurm_cluster    # start one, print its SLURM_CONF, wait for Ctrl-C (trying things by hand)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAMS = ("sbatch", "slurmctld", "slurmd", "munged", "squeue", "scontrol", "scancel", "sinfo", "srun")
NODES = ("node1", "node2")
PARTITION = "debug"
START_TIMEOUT_S = 60.0


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks ([] when a cluster can be started)."""
    return [name for name in PROGRAMS if shutil.which(name) is None and not Path("/usr/sbin", name).is_file()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    """munged + slurmctld + two slurmd in `folder`; `env` is what a Slurm client needs (SLURM_CONF)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.hidden = self.folder / "hidden"  # a folder the nodes do not see (an empty tmpfs over it)
        self.conf = self.folder / "slurm.conf"
        self.processes: list[subprocess.Popen] = []
        self.env = {"SLURM_CONF": str(self.conf)}

    # ----- start
    def start(self) -> SlurmCluster:
        """Start every daemon and wait until both nodes are idle."""
        for sub in ("state", "spool", "munge", "log", "hidden"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        socket_path = self.folder / "munge" / "munge.sock"
        self._spawn(
            [
                _program("munged"),
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={socket_path}",
                f"--pid-file={self.folder / 'munge' / 'munged.pid'}",
                f"--log-file={self.folder / 'log' / 'munged.log'}",
                f"--seed-file={self.folder / 'munge' / 'munged.seed'}",
            ]
        )
        _wait_for(socket_path.exists, "munged's socket")
        self.conf.write_text(self._config(socket_path))
        self._spawn([_program("slurmctld"), "-D", "-f", str(self.conf)])
        for node in NODES:
            (self.folder / "spool" / node).mkdir(exist_ok=True)
            # A mount namespace per node with an empty tmpfs over `hidden`: that folder is not shared storage.
            inner = f"mount -t tmpfs none {self.hidden} && exec {_program('slurmd')} -D -N {node} -f {self.conf}"
            self._spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner])
        _wait_for(self._nodes_idle, "both slurm nodes idle", self._logs)
        return self

    def _spawn(self, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{Path(command[0]).name}-{len(self.processes)}.out", "ab")
        env = {**os.environ, **self.env}
        self.processes.append(
            subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        )

    def _config(self, munge_socket: Path) -> str:
        folder = self.folder
        host = socket.gethostname()
        nodes = "\n".join(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={os.cpu_count() or 1} "
            "RealMemory=1000 State=UNKNOWN"
            for node in NODES
        )
        return f"""ClusterName=finetune-tests
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={folder / "state"}
SlurmdSpoolDir={folder / "spool"}/%n
SlurmctldPidFile={folder / "slurmctld.pid"}
SlurmdPidFile={folder / "spool"}/slurmd-%n.pid
SlurmctldLogFile={folder / "log" / "slurmctld.log"}
SlurmdLogFile={folder / "log"}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=300
SlurmdTimeout=300
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""

    def _nodes_idle(self) -> bool:
        result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(node, "").startswith("idle") for node in NODES)

    def _logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted((self.folder / "log").iterdir())
        )

    # ----- use
    def run(self, command: list[str], check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, **self.env}, check=check, timeout=60
        )

    # ----- stop
    def stop(self) -> None:
        """Cancel every job, end the daemons (slurmd before slurmctld before munged), remove nothing it did not make."""
        with contextlib.suppress(Exception):
            self.run(["scancel", "--full", "-u", "root"], check=False)
        for proc in reversed(self.processes):
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _wait_for(ready, what: str, details=lambda: "") -> None:  # noqa: ANN001 - a test helper
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the test Slurm cluster did not start: no {what} after {START_TIMEOUT_S:.0f} s\n" + details()
            )
        time.sleep(0.2)


if __name__ == "__main__":
    folder = Path(tempfile.mkdtemp(prefix="slurm-"))
    cluster = SlurmCluster(folder).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        sys.exit(0)
