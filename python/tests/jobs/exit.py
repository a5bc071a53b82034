"""A worker of test_launcher.py: prints a line on stdout and stderr; rank 1 then exits with
status 3 while rank 0 sleeps (it must be stopped by the launcher). Usage: exit.py."""

import os
import sys
import time

rank = int(os.environ["BYTEPS_LOCAL_RANK"])
print(f"hello from {rank}", flush=True)
print(f"note from {rank}", file=sys.stderr, flush=True)
if rank == 1:
    time.sleep(1)  # both ranks have started and printed
    sys.exit(3)
time.sleep(120)
