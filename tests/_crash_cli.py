"""A ``main`` that dies by SIGSEGV, to show the fork server reports signals (tests only)."""
import os
import signal


def main(argv=None) -> int:
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0
