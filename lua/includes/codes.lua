-- codes.lua: the codes the scripts answer with or take (ClaimCode_RUN is ClaimCode.RUN).
-- GENERATED from the IntEnums of reach/scripts/codes.py, where they are written once:
-- do not edit (tests/lua/test_includes.py checks this file). Regenerate with
--   .venv/bin/python -c 'from reach.scripts import codes; codes.write_lua()'
local RegisterCode_NEW, RegisterCode_REPLACED, RegisterCode_STALE = 1, 2, -1
local HeartbeatCode_RENEWED, HeartbeatCode_RECOVERED, HeartbeatCode_NOT_REGISTERED, HeartbeatCode_STALE = 1, 2, 0, -1
local DeregisterCode_REMOVED, DeregisterCode_NOT_FOUND, DeregisterCode_OTHER_INSTANCE = 1, 0, -1
local MarkReadyCode_SET, MarkReadyCode_NOT_REGISTERED, MarkReadyCode_OTHER_INSTANCE = 1, 0, -1
local DrainCode_DRAINING, DrainCode_ALREADY_DRAINING, DrainCode_NOT_FOUND, DrainCode_OTHER_INSTANCE = 1, 2, 0, -1
local SweepCode_LOCKED = -1
local ClaimCode_RUN, ClaimCode_REPLAY, ClaimCode_BUSY, ClaimCode_CANCELLED, ClaimCode_POISONED = 1, 2, 3, 4, 5
local SettleCode_SETTLED, SettleCode_FENCED = 1, 0
local FollowUpKind_NONE, FollowUpKind_DEAD_LETTER, FollowUpKind_RETRY = 0, 1, 2
local DropInboxCode_DROPPED, DropInboxCode_KEPT = 1, 0
local StreamBound_REPLIES = 100000
local CancelCode_CANCELLED, CancelCode_ALREADY_CANCELLED, CancelCode_DONE, CancelCode_UNKNOWN = 1, 2, 0, -1
local RerouteCode_MOVED, RerouteCode_GONE, RerouteCode_READ, RerouteCode_FULL, RerouteCode_SETTLED = 1, 0, 2, 3, 4
local StepCode_JOURNALED, StepCode_KEPT, StepCode_FULL, StepCode_FENCED = 1, 2, 3, 0
local StepBound_RESULT_BYTES, StepBound_STEPS, StepBound_NAME_BYTES = 65536, 100, 200
local KeepCode_KEPT, KeepCode_KNOWN, KeepCode_CLOSED = 1, 0, -1
local ChunkBound_ENTRY_BYTES = 536870912
local AskCode_ASKED, AskCode_ANSWERED, AskCode_WITHDRAWN, AskCode_FULL, AskCode_FENCED = 1, 2, 3, 4, 0
local AnswerCode_ANSWERED, AnswerCode_ALREADY, AnswerCode_NOT_WAITING, AnswerCode_UNKNOWN = 1, 2, 0, -1
local AskBound_QUESTION_BYTES, AskBound_ANSWER_BYTES, AskBound_ASKS = 4096, 65536, 100
