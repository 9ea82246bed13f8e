"""Sending alerts: tuner/rules decides what is due, this package delivers it."""

from tuner.notify.alertmanager import FlushResult, Notifier

__all__ = ["Notifier", "FlushResult"]
