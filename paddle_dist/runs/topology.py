"""Which ranks ran on which machine: what the machines of a multi-node launch learnt when
they met (`Meeting`, built by launch/rendezvous.py), and one machine's view of it for the
report (`Machines`), which names every rank with its host on several machines.

Example:
    meeting = Meeting("", {0: Node(2, "10.0.0.1"), 1: Node(2, "10.0.0.2", "nodeB")}, node_rank=1)
    Machines("nodeB", (2, 3), 2, meeting).name(0)     # 'rank 0 (host 10.0.0.1)'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .status import RankStatus


@dataclass(frozen=True)
class Node:
    """One machine of the job, as the meeting saw it: its ranks, its address as node 0
    saw it (node 0: dist.master's host), and its host name ("" when not told)."""
    nprocs: int
    address: str
    host: str = ""


@dataclass(frozen=True)
class Meeting:
    """What the machines learnt when they met: node 0's run name ("" when it has none yet),
    every node by node_rank (a node > 0 knows no other node's host name) and which one
    this machine is."""
    run: str = ""
    nodes: Dict[int, Node] = field(default_factory=dict)
    node_rank: int = 0
    # node 0: Paddle's launchers' rendezvous, served on the meeting's listener (kvserver.py)
    rendezvous: Optional[object] = field(default=None, compare=False, repr=False)
    # elastic: the node_ranks (as configured) that did not come; the machines that did are
    # numbered 0, 1, ... in node_rank order, in `nodes` and `node_rank`
    absent: Tuple[int, ...] = ()

    @classmethod
    def of(cls, run: str, arrived: Dict[int, Node], nnodes: int, node_rank: int = 0,
           rendezvous: Optional[object] = None) -> "Meeting":
        """The meeting of the machines `arrived` ({configured node_rank: Node}) out of
        `nnodes`, seen from configured node `node_rank`: renumbered when some are absent.

        Example:
            Meeting.of("", {0: Node(2, "a"), 2: Node(2, "c")}, 3, node_rank=2).node_rank   # 1
        """
        order = sorted(arrived)
        return cls(run, {i: arrived[r] for i, r in enumerate(order)}, order.index(node_rank), rendezvous,
                   tuple(r for r in range(nnodes) if r not in arrived))

    @property
    def world_size(self) -> int:
        return sum(n.nprocs for n in self.nodes.values())

    def ranks_of(self, node_rank: int) -> range:
        """The global ranks of node `node_rank`: Paddle's launcher numbers the ranks of the
        nodes in node_rank order (its rank_offset), each node's in a block.

        Example:
            Meeting("", {0: Node(2, "a"), 1: Node(2, "b")}).ranks_of(1)   # range(2, 4)
        """
        start = sum(n.nprocs for r, n in self.nodes.items() if r < node_rank)
        return range(start, start + self.nodes[node_rank].nprocs) if node_rank in self.nodes else range(0)

    def node_of(self, rank: int) -> Optional[int]:
        """The node_rank holding global rank `rank` (None when unknown)."""
        for node_rank in sorted(self.nodes):
            if rank in self.ranks_of(node_rank):
                return node_rank
        return None


@dataclass(frozen=True)
class Machines:
    """Where a job's ranks run, as one machine's launcher knows it: this machine's host name
    and global ranks, the job's number of machines, and what the machines learnt when they
    met (a multi-node launch, Meeting). The default is a job on one machine, whose
    reports name ranks without hosts.

    Example:
        Machines("nodeB", (2, 3), nnodes=2).name(3)     # 'rank 3 (host nodeB)'
    """
    host: str = ""
    local: Tuple[int, ...] = ()
    nnodes: int = 1
    meeting: Optional[Meeting] = None

    @property
    def several(self) -> bool:
        return self.nnodes > 1 or (self.meeting is not None and len(self.meeting.nodes) > 1)

    def host_of(self, rank: int, record: Optional[RankStatus] = None) -> str:
        """Rank `rank`'s host: its status record's, this machine's for its own ranks, else
        the address its machine met from ("" when unknown)."""
        if record is not None and record.host:
            return str(record.host)
        if rank in self.local:
            return self.host
        node = self.meeting.node_of(rank) if self.meeting else None
        return (self.meeting.nodes[node].host or self.meeting.nodes[node].address) if node is not None else ""

    def name(self, rank: int, record: Optional[RankStatus] = None, more: str = "") -> str:
        """'rank 3' on one machine; 'rank 3 (host nodeB)' on several; `more` joins the
        parenthesis ('rank 3 (host nodeB, killed by SIGABRT)')."""
        said = [f"host {self.host_of(rank, record)}"] if self.several and self.host_of(rank, record) else []
        said += [more] if more else []
        return f"rank {rank} ({', '.join(said)})" if said else f"rank {rank}"

    def is_here(self, record: RankStatus) -> bool:
        """Whether a status record is of a rank of this machine (on shared storage the
        other machines' are there too), so that its pid means something here."""
        if self.local:
            return record.rank in self.local
        return not self.several or not self.host or record.host in (None, self.host)


ONE_MACHINE = Machines()
