"""A world of one waits on a receive nobody sends; SIGINT must end the wait with
KeyboardInterrupt."""

import numpy as np

import sucl

comm = sucl.init()
buf = np.zeros(4, np.float32)
req = comm.irecv(buf, 0, tag=1)
print("WAITING", flush=True)
try:
    req.wait()
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
