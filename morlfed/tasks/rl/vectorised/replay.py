"""Per-client replay buffers as one tensor ``[N, capacity, width]``, with SB3 ``ReplayBuffer`` semantics.

A row holds one transition packed as ``observation | next observation | action | reward |
done`` (float32; discrete actions are small integers, exact in float32). Each client's buffer is
circular: ``pos`` is the next row to write and ``full`` says whether it has wrapped; a sample
draws ``batch_size`` rows uniformly from ``[0, pos)`` (``[0, capacity)`` once full) from that
client's own random stream, like ``ReplayBuffer.sample`` with one env. ``done`` is SB3's
``dones * (1 - timeouts)`` (``handle_timeout_termination``): 1 only for a true termination, so a
truncated episode stores 0, and its next observation is the true final observation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from morlfed.tasks.rl.vectorised.learner import Batch


class Transitions:
    """One transition per client as replay rows (``rows``, ``[N, width]`` float32).

    Every field has a view to fill in place.

    :param n: number of clients
    :param obs_dim: flattened observation size
    :param action_dim: action size
    """

    def __init__(self, n: int, obs_dim: int, action_dim: int) -> None:
        o, a = obs_dim, action_dim
        self.rows = np.zeros((n, 2 * o + a + 2), dtype=np.float32)
        #: the observations the actions were taken in, ``[N, obs_dim]``
        self.obs = self.rows[:, :o]
        #: the next observations (the true final one at an episode's end), ``[N, obs_dim]``
        self.next_obs = self.rows[:, o : 2 * o]
        #: the actions as stored (indices for discrete actions), ``[N, action_dim]``
        self.actions = self.rows[:, 2 * o : 2 * o + a]
        #: the scalar rewards, ``[N]``
        self.rewards = self.rows[:, 2 * o + a]
        #: 1 for a true termination, else 0 (truncations included), ``[N]``
        self.dones = self.rows[:, 2 * o + a + 1]


class StackedReplay:
    """N clients' replay buffers.

    :param n: number of clients
    :param capacity: each client's buffer size (SB3's ``buffer_size``)
    :param obs_dim: flattened observation size
    :param action_dim: action size (1 for a discrete action)
    :param discrete: whether actions are indices (sampled as ``int64``, like SB3 stores them)
    :param device: torch device of the buffers and of the sampled batches
    """

    def __init__(
        self, n: int, capacity: int, obs_dim: int, action_dim: int, discrete: bool, device: str = "cpu"
    ) -> None:
        self.n, self.capacity, self.obs_dim, self.action_dim = n, capacity, obs_dim, action_dim
        self.discrete, self.device = discrete, torch.device(device)
        self.width = 2 * obs_dim + action_dim + 2
        self.data = torch.zeros(n, capacity, self.width, device=self.device)
        self.pos = np.zeros(n, dtype=np.int64)
        self.full = np.zeros(n, dtype=bool)
        #: the buffers as a numpy array sharing their memory (CPU only): cheaper single-row writes
        self._host = self.data.numpy() if self.device.type == "cpu" else None
        self._offsets = torch.arange(n, device=self.device).unsqueeze(1) * capacity

    def transitions(self) -> Transitions:
        """A staging area for one transition per client, in this buffer's row format."""
        return Transitions(self.n, self.obs_dim, self.action_dim)

    def add(self, rows: np.ndarray, transitions: np.ndarray) -> None:
        """Append one transition to each client in ``rows``.

        :param rows: client indices (distinct)
        :param transitions: ``[len(rows), width]`` rows (from :class:`Transitions`)
        """
        pos = self.pos[rows]
        if self._host is not None:
            self._host[rows, pos] = transitions
        else:
            index = (torch.from_numpy(rows).to(self.device), torch.from_numpy(pos).to(self.device))
            self.data[index] = torch.from_numpy(np.ascontiguousarray(transitions, dtype=np.float32)).to(self.device)
        pos = pos + 1
        self.full[rows] |= pos == self.capacity
        self.pos[rows] = pos % self.capacity

    def size(self, i: int) -> int:
        """How many transitions client ``i`` can sample from."""
        return self.capacity if self.full[i] else int(self.pos[i])

    def sample(self, uniforms: np.ndarray) -> Batch:
        """One minibatch per client, its rows picked by ``uniforms``.

        ``uniforms`` (``[N, B]`` in ``[0, 1)``, from each client's own stream) pick rows
        ``floor(u * size)`` of the client's filled rows, i.e. uniform indices in ``[0, pos)``
        (``[0, capacity)`` once full). Rows of an empty buffer are placeholders.

        :param uniforms: each client's uniform draws, one per transition of its minibatch
        """
        sizes = np.where(self.full, self.capacity, self.pos)
        inds = np.minimum((uniforms * sizes[:, None]).astype(np.int64), np.maximum(sizes - 1, 0)[:, None])
        batch_size = inds.shape[1]
        flat = (torch.from_numpy(inds).to(self.device) + self._offsets).flatten()
        rows = self.data.view(-1, self.width).index_select(0, flat).view(self.n, batch_size, self.width)
        o, a = self.obs_dim, self.action_dim
        actions = rows[..., 2 * o : 2 * o + a]
        return Batch(
            observations=rows[..., :o],
            actions=actions.long() if self.discrete else actions,
            next_observations=rows[..., o : 2 * o],
            dones=rows[..., 2 * o + a + 1 :],
            rewards=rows[..., 2 * o + a : 2 * o + a + 1],
        )

    def state_of(self, i: int) -> dict[str, Any]:
        """Client ``i``'s buffer (its filled rows on the CPU, ``pos``, ``full``; a copy)."""
        return {"rows": self.data[i, : self.size(i)].cpu().clone(), "pos": int(self.pos[i]), "full": bool(self.full[i])}

    def load_state_of(self, i: int, state: dict[str, Any]) -> None:
        """Restore client ``i``'s buffer from :meth:`state_of`."""
        rows = state["rows"]
        if rows.shape[1:] != (self.width,) or len(rows) > self.capacity:
            raise ValueError(
                f"replay rows of shape {tuple(rows.shape)} do not fit a [{self.capacity}, {self.width}] buffer"
            )
        self.data[i].zero_()
        self.data[i, : len(rows)] = rows.to(self.device)
        self.pos[i], self.full[i] = int(state["pos"]), bool(state["full"])
