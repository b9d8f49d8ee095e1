"""TokenConversation: the one owner of an exact running token sequence, as segments.

The ReAct loop's `TokenChatModel` and the gateway's sessions both turn a message history into
the exact tokens a model saw and produced. This class is that bookkeeping, written once:

- a request whose messages extend a segment (its messages unchanged, new ones after) appends
  only the new messages' tokens (`ChatCodec.continuation_ids`); generated tokens are kept as
  sampled (mask 1, engine logprobs) and never re-tokenized;
- a request that rewrites history after an assistant turn the segment holds *rolls back*: a new
  segment whose prompt is the exact tokens up to that turn, then the rest rendered as context
  (`rollback`); the old segment keeps what it generated;
- anything else (a rewritten start, condensed history, changed tools) opens a segment rendered
  from scratch, with the reason it began;
- with `follow_template`, a history the template would show differently from the running
  tokens (it strips earlier reasoning, say) opens a segment rendered as the template does
  (`template`): the model then sees what a chat endpoint would show it. Without it (the
  default) the model keeps seeing its own tokens and the difference is reported as drift.

Every generated token is in exactly one segment with mask 1; a later segment's prompt may hold
it again, as context. Nothing generated is dropped. State changes only in `commit` (after a
generation succeeded), so a request that fails leaves the conversation as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.errors import TemplateError
from uniagent.tokens.codec import ChatCodec, Messages, Tools
from uniagent.tokens.drift import DriftReport, drift_report
from uniagent.tokens.trajectory import Trajectory

Inject = Callable[[Messages, list[dict[str, Any]]], Messages]
"""For a template that cannot render tools: the messages with the tools described in them (the
tool parser's instructions in the system prompt). Used for full renders only."""


@dataclass
class Segment:
    """One exact, append-only token sequence and the messages it stands for."""

    trajectory: Trajectory
    tools: Tools
    keys: list[Any] = field(default_factory=list)  # one per message: what must match to extend
    messages: Messages = field(default_factory=list)  # as the template sees them (for drift)
    turn_ends: dict[int, int] = field(default_factory=dict)  # assistant message index -> tokens
    cut_turn: bool = False  # the last generation stopped without its end-of-turn
    ended: str | None = None  # set by the owner (e.g. "length": the context cap was reached)
    prompt_mask: list[int] | None = None  # 1: a prompt token generated in an earlier segment
    drift_error: str | None = None  # why the drift could not be checked (see `finish`)

    @property
    def token_ids(self) -> list[int]:
        return self.trajectory.token_ids


@dataclass
class Plan:
    """A request turned into a prompt. Applied by `TokenConversation.commit` only."""

    segment: Segment | None  # the segment this request extends, or None: a new segment
    reason: str  # why the new segment begins ("" when extending)
    chain: int
    prompt_ids: list[int]
    context: list[tuple[list[int], str]]  # (ids, role) appended to `segment` before generating
    keys: list[Any]  # the request's match keys (the very `messages` list when keys are messages)
    messages: Messages  # the whole request, as the template sees it (not copied until commit)
    tools: Tools
    prompt_mask: list[int] | None = None  # a rollback's prompt: 1 where the model generated it


@dataclass
class Reply:
    """A committed generation: its text (the stop token removed) and where it landed."""

    text: str
    stopped: bool  # ended with a stop token (else cut: max_tokens or abort)
    segment: Segment
    prompt_tokens: int


class TokenConversation:
    """Segments of one episode (or one gateway session). See the module docstring."""

    def __init__(
        self,
        codec: ChatCodec,
        stop_ids: Sequence[int] | None = None,
        native_tools: bool | None = None,
        inject: Inject | None = None,
        follow_template: bool = False,
    ) -> None:
        self.codec = codec
        self.stop_ids = set(stop_ids if stop_ids is not None else codec.stop_token_ids)
        self.native_tools = codec.renders_tool_calls if native_tools is None else native_tools
        self.inject = inject
        self.follow_template = follow_template
        self.segments: list[Segment] = []
        self._forced: str | None = None
        self._chains = 0

    # -- views -----------------------------------------------------------------------------
    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def trajectories(self) -> list[Trajectory]:
        return [s.trajectory for s in self.segments]

    @property
    def context_tokens(self) -> int:
        """Tokens of the current segment: what the next generation's context holds."""
        return len(self.current.trajectory) if self.segments else 0

    @property
    def generated_tokens(self) -> int:
        return sum(s.trajectory.num_model_tokens for s in self.segments)

    def begin_segment(self, reason: str) -> None:
        """The next request is rendered afresh and starts a segment with `reason` (same chain)."""
        self._forced = reason

    # -- requests --------------------------------------------------------------------------
    def plan(self, messages: Messages, tools: Tools = None, keys: list[Any] | None = None) -> Plan:
        """Where `messages` go: extend a segment, roll one back, or start one.

        `messages` are as the template should see them; `keys` (default: the messages) say what
        must be unchanged for a message to count as the same one (a gateway compares them
        whitespace-insensitively)."""
        keys = messages if keys is None else keys
        if len(keys) != len(messages):
            raise ValueError(f"{len(keys)} keys for {len(messages)} messages")
        forced, chain = self._forced, self._chain_now()
        if forced is None:
            for seg in reversed(self.segments):
                n = len(seg.keys)
                if seg.tools == tools and len(keys) > n and keys[:n] == seg.keys:
                    plan = self._extend(seg, messages, tools, keys)
                    if not (self.follow_template and self._template_rewrites(plan)):
                        return plan
                    forced, chain = "template", seg.trajectory.chain
                    break
            if forced is None:
                rolled = self._rollback(messages, tools, keys)
                if rolled is not None:
                    return rolled
        reason = forced or ("start" if not self.segments else "rewritten")
        chain = self._chains if reason in ("start", "rewritten") else chain
        prompt = self.codec.prompt_ids(*self.full_view(messages, tools))
        return Plan(None, reason, chain, prompt, [], keys, messages, tools)

    def _chain_now(self) -> int:
        return self.current.trajectory.chain if self.segments else 0

    def _extend(self, seg: Segment, messages: Messages, tools: Tools, keys: list[Any]) -> Plan:
        new = messages[len(seg.keys) :]
        context: list[tuple[list[int], str]] = []
        if seg.cut_turn:  # the last turn stopped without its end-of-turn: close it as context
            context.append((self.codec.eot_ids, "assistant"))
        # the running ids so far: only a stateful template needs them (an O(length) copy)
        held = seg.token_ids + [t for ids, _ in context for t in ids] if self.codec.facts.stateful else []
        context.append((self._continuation(seg.messages, new, tools, held), new[0].get("role", "context")))
        prompt = seg.token_ids + [t for ids, _ in context for t in ids]
        return Plan(seg, "", seg.trajectory.chain, prompt, context, keys, messages, tools)

    def _template_rewrites(self, plan: Plan) -> bool:
        """Whether the template shows this history differently from the running tokens (it strips
        earlier reasoning, say). Compared as text, so a sampled non-canonical split of the
        model's own text does not count. A full render per turn: only with `follow_template`."""
        shown, shown_tools = self.full_view(plan.messages, plan.tools)
        return self.codec.render(shown, shown_tools) != self.codec.decode(plan.prompt_ids)

    def _rollback(self, messages: Messages, tools: Tools, keys: list[Any]) -> Plan | None:
        """The latest segment sharing an assistant turn with the request, cut after that turn."""
        for seg in reversed(self.segments):
            if seg.tools != tools or not seg.turn_ends:
                continue
            same = 0
            for a, b in zip(keys, seg.keys, strict=False):
                if a != b:
                    break
                same += 1
            kept = [i for i in seg.turn_ends if i < same and i < len(messages) - 1]
            if not kept:
                continue
            cut = max(kept)
            prefix = seg.token_ids[: seg.turn_ends[cut]]
            if prefix[-1:] and prefix[-1] not in self.stop_ids:
                prefix = prefix + self.codec.eot_ids  # that turn was cut: close it as context
            prompt = prefix + self._continuation(messages[: cut + 1], messages[cut + 1 :], tools, prefix)
            traj = seg.trajectory
            mask = (seg.prompt_mask or [0] * len(traj.prompt_ids)) + traj.response_mask
            mask = mask[: seg.turn_ends[cut]] + [0] * (len(prompt) - seg.turn_ends[cut])
            return Plan(None, "rollback", traj.chain, prompt, [], keys, messages, tools, mask)
        return None

    def _continuation(self, history: Messages, new: Messages, tools: Tools, held: list[int]) -> list[int]:
        """The ids after `held` (the tokens of `history`) for `new`. A stateful template
        (`codec.facts.stateful`) is given the history as a full render sees it."""
        if not self.codec.facts.stateful:
            return self.codec.continuation_ids(new, self.template_tools(tools))
        shown, shown_tools = self.full_view([*history, *new], tools)
        k = len(shown) - len(new)
        return self.codec.continuation_ids(shown[k:], shown_tools, history=shown[:k], held_ids=held)

    def template_tools(self, tools: Tools) -> Tools:
        """The tools the template is given: all of them when it renders tools, else none."""
        return tools if (tools and self.native_tools) else None

    def full_view(self, messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
        """Messages and tools as a full render of the template takes them."""
        if tools and not self.native_tools and self.inject is not None:
            return self.inject(messages, tools), None
        return messages, self.template_tools(tools)

    def commit(
        self,
        plan: Plan,
        token_ids: list[int],
        logprobs: list[float],
        finish_reason: str = "stop",
        versions: list[int] | None = None,
    ) -> Reply:
        """Record a successful generation for `plan` (`versions`: the policy version of each token,
        None if the engine does not say); the reply's message comes via `add_reply`."""
        seg = plan.segment
        if seg is None:
            traj = Trajectory(prompt_ids=list(plan.prompt_ids), reason=plan.reason, chain=plan.chain)
            seg = Segment(traj, plan.tools, prompt_mask=plan.prompt_mask)
            if plan.reason in ("start", "rewritten"):
                self._chains += 1
            self.segments.append(seg)
            self._forced = None
        else:
            for ids, role in plan.context:
                seg.trajectory.add_context(ids, role=role)
        # Only what is new is copied (the rest was checked equal by `plan`): the caller may change
        # its own message dicts later, and a copy of the whole history per turn grows with it.
        n = len(seg.keys)
        new_messages = copy.deepcopy(plan.messages[n:])
        new_keys = new_messages if plan.keys is plan.messages else copy.deepcopy(plan.keys[n:])
        seg.keys.extend(new_keys)
        seg.messages.extend(new_messages)
        seg.trajectory.add_generation(token_ids, logprobs, finish_reason, versions)
        stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
        seg.cut_turn = not stopped
        text = self.codec.decode(token_ids[:-1] if stopped else token_ids)
        return Reply(text, stopped, seg, len(plan.prompt_ids))

    def add_reply(self, reply: Reply, message: dict[str, Any], key: Any = None) -> None:
        """The assistant message the generation stands for (template view) and its match key."""
        seg = reply.segment
        seg.turn_ends[len(seg.keys)] = len(seg.trajectory)
        seg.keys.append(message if key is None else key)
        seg.messages.append(message)

    # -- results ---------------------------------------------------------------------------
    def finish(
        self,
        drift: Callable[[Segment, Messages, Tools], tuple[int | None, str | None]] | None = None,
    ) -> list[Trajectory]:
        """Every segment, validated, with its drift against a full render of its messages.

        `drift(segment, messages, tools)` (the full-render view) returns (index, kind); the
        default is `segment_drift`."""
        out = []
        for seg in self.segments:
            traj = seg.trajectory
            shown, shown_tools = self.full_view(seg.messages, seg.tools)
            traj.drift, traj.drift_kind = (drift or self.segment_drift)(seg, shown, shown_tools)
            traj.validate()
            out.append(traj)
        return out

    def segment_drift(self, seg: Segment, messages: Messages, tools: Tools) -> DriftReport:
        """`drift_report` of a segment (a rollback's prompt marked where the model wrote it).

        A history the template cannot render in full (a role order it refuses, say, while each
        continuation rendered) gives drift 0 of kind `bookkeeping` and `seg.drift_error`, for the
        ReAct loop and the gateway alike: raising would cost the episode its whole token record
        although every token in it is exact as recorded, and no drift (None) would claim an
        exactness nobody checked; 0 keeps the tokens and flags the segment for a look."""
        try:
            return drift_report(self.codec, messages, seg.trajectory, tools, seg.prompt_mask)
        except TemplateError as exc:
            seg.drift_error = str(exc)
            return DriftReport(0, "bookkeeping")
