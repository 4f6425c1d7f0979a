"""Who may join a job, and what it shows the network. Imports no paddle.

- auth: the job token and the proofs that a machine or a rank holds it;
- rankgate: the gate of a one-machine job (RankGate; its rank side runs as a plain script);
- tls: mutual TLS for the machines' meeting; kvserver: Paddle's multi-node rendezvous,
  served by node 0 on the meeting's listener;
- attest, storewire: after the process group starts, its store holds this job's ranks only;
- private: a directory no other user can enter; safepickle: unpickling plain values only;
- exposure: what a job opens to the network, and what guards it.

The face re-exports nothing: rankgate.py runs as a script with auth.py beside it, and every
module is imported on its own.
"""

__all__: list = []
