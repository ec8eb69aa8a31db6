"""A multi-process run whose process dies: the survivors stop at once, with one line that
names the lost process and the checkpoint a restart resumes from, instead of waiting in
collectives and barriers for a process that will not come back.

The state here is the process's, like jax.distributed's own: one multi-process run per process.
"""

import contextlib
import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain.errors import PeerLost, UserError

# A process of a multi-process run that dies takes the run with it: the survivors' collectives
# fail (gloo at once; NCCL may hang instead), orbax's commits wait in barriers for it, and jax's
# exit handler waits in a shutdown barrier until the heartbeat timeout, then aborts with a
# multi-line report. So a survivor ends itself: one line that names the lost process (and, in the
# training loop, the checkpoint a restart resumes from), then os._exit, past those waits.
#
# To tell which process is gone, each one listens on a TCP port of its own, learned by all at
# setup: the kernel completes a connection to a live process's port and refuses one to a dead
# process's. While the loop runs, a thread probes every other process each PROBE_EVERY_S, so a
# survivor blocked where no error comes (an orbax barrier, an NCCL collective) ends too.

PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0
# A process that leaves keeps answering probes this long before it exits, so that the other
# survivors name the process that was lost first, not each other; orbax's finishing of a
# checkpoint whose every part was written (a rename) also completes in this time.
LINGER_S = 1.0
_LOST_WORDS = re.compile(r"gloo|nccl|connection (closed|reset|refused)|socket closed|heartbeat|"
                         r"coordination ?service|barrier", re.IGNORECASE)
_ADDRESS_BYTES = 320


@dataclasses.dataclass
class _Watched:
  step: Callable[[], int]  # the step the loop is at
  restart: Callable[[], str]  # what a restart does: "resume from the checkpoint of step 50"


@dataclasses.dataclass
class _Peers:
  addresses: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # by process index
  watched: _Watched | None = None
  silence_limit_s: float = 150.0  # a process whose host stays silent this long is lost
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  leaving: threading.Event = dataclasses.field(default_factory=threading.Event)


_peers = _Peers()


def set_silence_limit(seconds: float) -> None:
  """How long a host may stay silent before its process counts as lost."""
  _peers.silence_limit_s = max(seconds, 2 * PROBE_TIMEOUT_S)


@contextlib.contextmanager
def watch_peers(step: Callable[[], int], restart: Callable[[], str]):
  """While the block runs, a lost process ends this one with a line that names `step()` and
  `restart()`, whether the block raises (a failed collective) or blocks."""
  _peers.watched = _Watched(step, restart)
  try:
    yield
  except Exception as e:
    end_if_lost(e)
    raise
  finally:
    with _peers.lock:  # waits for a leaving watch thread, which ends the process
      _peers.watched = None


def end_if_lost(e: BaseException) -> None:
  """Ends this process with one line if `e` means that another process of the run is gone;
  returns otherwise."""
  if _peers.leaving.is_set():  # another thread is ending the process with the line
    threading.Event().wait()
  if isinstance(e, UserError) or not isinstance(e, Exception) or jax.process_count() == 1:
    return
  named = bool(_LOST_WORDS.search(str(e)))
  gone = _gone(wait_s=PROBE_TIMEOUT_S if named else 0.0)
  if named or gone:
    logging.getLogger("jaxtrain").error("a collective failed: %s", e)
    _leave(gone, _reason(e), _peers.watched)


@contextlib.contextmanager
def ends_if_lost():
  try:
    yield
  except Exception as e:
    end_if_lost(e)
    raise


def _leave(lost: list[int], reason: str, watched: _Watched | None) -> None:
  """Prints the line and exits; returns only if the watch this was about has ended."""
  _peers.lock.acquire()  # never released: the process ends holding it
  if watched is not _peers.watched:
    _peers.lock.release()
    return
  _peers.leaving.set()
  time.sleep(LINGER_S)
  n, me = jax.process_count(), jax.process_index()
  if not lost and n == 2:
    lost = [1 - me]
  who = (f"process {lost[0]} of {n}" if len(lost) == 1 else
         f"processes {', '.join(map(str, lost))} of {n}" if lost else f"another of the {n} processes")
  message = f"lost contact with {who}"
  if watched is not None:
    message += f" at step {watched.step()} ({reason}); restart every process to {watched.restart()}"
  else:
    message += f" ({reason}); restart every process"
  error = PeerLost(message)
  logging.getLogger("jaxtrain").error("%s", error)
  sys.stdout.flush()
  print(f"error: {error}", file=sys.stderr, flush=True)
  os._exit(error.exit_code)  # past jax's and orbax's waits for the lost process (see above)


def _reason(e: BaseException) -> str:
  """The failure in a few words: 'Gloo AllGather failed: Connection closed by peer [host]:port'."""
  text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  text = re.sub(r"^[A-Z_]+: ", "", text)  # the status code (UNKNOWN, INTERNAL)
  text = re.sub(r"\[[^\]\s]+\.(cc|h|cpp):\d+\] ", "", text)  # the C++ source location
  return text[:160]


def open_probe_port(coordinator_address: str) -> None:
  """Listens on a port of its own and learns every other process's (a collective)."""
  if jax.process_count() == 1:
    return
  host = _own_host(coordinator_address)
  # On the address the other processes reach this host by; by name (Slurm): on every interface.
  listener = socket.create_server((host if host != socket.gethostname() else "", 0),
                                  family=socket.getaddrinfo(host, None)[0][0], backlog=1024)
  threading.Thread(target=_answer, args=(listener,), name="jaxtrain-probe-port",
                   daemon=True).start()
  mine = f"{host}:{listener.getsockname()[1]}".encode()
  table = multihost_utils.process_allgather(
      np.frombuffer(mine.ljust(_ADDRESS_BYTES)[:_ADDRESS_BYTES], np.uint8))
  _peers.addresses = []
  for row in np.asarray(table):
    host, port = bytes(row).decode().rstrip().rsplit(":", 1)
    _peers.addresses.append((host, int(port)))
  threading.Thread(target=_watch, name="jaxtrain-peer-watch", daemon=True).start()


def _own_host(coordinator_address: str) -> str:
  """This host's address on the network that reaches process 0 (no packet is sent)."""
  host = coordinator_address.rsplit(":", 1)[0].strip("[]")
  try:
    family = socket.getaddrinfo(host, None)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
      s.connect((host, 9))
      return s.getsockname()[0]
  except (OSError, UnicodeError):  # no coordinator address (Slurm): by name
    return socket.gethostname()


def _answer(listener: socket.socket) -> None:
  while True:
    conn, _ = listener.accept()
    conn.close()


def _probe(address: tuple[str, int]) -> bool | None:
  """True: the process answers; False: its port refuses (it is gone); None: no answer yet."""
  try:
    with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
      return True
  except ConnectionRefusedError:
    return False
  except OSError:
    return None


def _probe_all() -> dict[int, bool | None]:
  others = [i for i in range(len(_peers.addresses)) if i != jax.process_index()]
  if not others:
    return {}
  with futures.ThreadPoolExecutor(min(16, len(others))) as pool:
    return dict(zip(others, pool.map(lambda i: _probe(_peers.addresses[i]), others)))


def _gone(wait_s: float) -> list[int]:
  """The processes whose port refuses, waiting up to `wait_s` for one to."""
  deadline = time.monotonic() + wait_s
  while True:
    gone = [i for i, answer in _probe_all().items() if answer is False]
    if gone or time.monotonic() >= deadline:
      return gone
    time.sleep(0.1)


def _watch() -> None:
  """Probes the other processes while the loop is watched; ends this one when one is lost."""
  silent_since: dict[int, float] = {}
  while True:
    time.sleep(PROBE_EVERY_S)
    watched = _peers.watched
    if watched is None:
      silent_since.clear()
      continue
    answers, now = _probe_all(), time.monotonic()
    for i, answer in answers.items():
      if answer is None:
        silent_since.setdefault(i, now)
      else:
        silent_since.pop(i, None)
    gone = [i for i, answer in answers.items() if answer is False]
    silent = [i for i, t in silent_since.items() if now - t >= _peers.silence_limit_s]
    if gone:
      _leave(gone, "it exited: its port refuses connections", watched)
    elif silent:
      _leave(silent, f"its host has not answered for {_peers.silence_limit_s:.0f}s", watched)
