"""Fault-injection tests: faults injected for real (kill -9, restarts, full disks). Those that
disturb infrastructure other tests share (the Docker engine itself: the `faults` marker) run
only when asked, SANDGYM_FAULTS_DOCKERD=1, which .ci/run sets: CI's machine is its own."""
