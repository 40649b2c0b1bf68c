"""Chapter 11, distributed training (``solutions/ch11_distributed_training.ipynb``).

11.1 a ring all-reduce written as a rank program over the simulator's ``Communicator``: the
values on every rank equal numpy's sum, the simulator's trace must show the ring (2(p - 1)
messages per rank, each one block, all to one neighbour) in the time of the alpha-beta formula,
and the result must come from the messages (one message is altered in transit; batched
collectives are refused);
11.2 a 1F1B pipeline schedule generator: valid, at most ``min(p - s, m)`` micro-batches in
flight on stage ``s`` and no bubble beyond GPipe's; 11.3 ZeRO's memory per device, term by term;
11.4 a bounded-staleness (SSP) parameter server, driven by an event loop with a straggler and
compared step by step with the rule.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide.
"""

from mlsys_lab.grading.exercises.ch11_distributed_training import (  # noqa: F401
    ex11_1_ring_allreduce,
    ex11_2_one_f_one_b,
    ex11_3_zero_memory,
    ex11_4_ssp_server,
)
