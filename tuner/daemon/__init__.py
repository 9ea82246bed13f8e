"""The daemon face (`tuner run`): scheduled jobs that call the use cases in tuner/app/, the state they hold
between ticks, and the listener that serves it (/metrics, /api/v1)."""

from tuner.daemon.jobs import Daemon, serve_daemon
from tuner.daemon.state import DaemonState

__all__ = ["Daemon", "DaemonState", "serve_daemon"]
