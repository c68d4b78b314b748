-- Wireshark / tshark dissector for gradswitch's data plane: the 32-byte header and elements of
-- include/gradswitch/wire.h (docs/protocol.md sections 2 and 7) and the DPDK switch's completion
-- signal (include/gradswitch/notify.h). Both are found by a heuristic on UDP (magic and version), so
-- no port has to be configured; "Decode As... GRADSWITCH" works as well.
--
--   tshark -X lua_script:tools/wireshark/gradswitch.lua -r capture.pcap -Y gradswitch
--   wireshark -X lua_script:tools/wireshark/gradswitch.lua capture.pcap
--   (or copy this file into ~/.local/lib/wireshark/plugins/)
--
-- Preferences: gradswitch.max_elements, how many elements of a packet are shown (the rest is
-- summarised; 0 shows none). Display filter examples: `gradswitch.type == 3` (ABORTs),
-- `gradswitch.flags.retx == 1`, `gradswitch.seq == 7 && gradswitch.rank == 2`,
-- `gradswitch.abort_reason == 5` (mismatch), `_ws.expert.group == "Malformed"`.
--
-- Wireshark 4.0 runs Lua 5.2: no integer operators, bit32 for bit fields.

local bit32 = bit32

local GS_MAGIC = 0x4753
local GS_VERSION = 2
local GS_HEADER_BYTES = 32
local GS_HELD_BODY_BYTES = 8  -- HELD: the round's contributors
local GS_RANK_ALL = 0xFFFF
local GS_EXP_NONE = -128

local msg_types = {
  [1] = "DATA",
  [2] = "RESULT",
  [3] = "ABORT",
  [4] = "RING_PARTIAL",
  [5] = "RING_RESULT",
  [6] = "RING_DONE",
  [7] = "HELD",
}
-- Element types: name and size in bytes.
local elem_types = {
  [1] = "int32",
  [2] = "float32",
  [3] = "fixed32",
  [4] = "float16",
  [5] = "bfloat16",
  [6] = "float64",
  [7] = "mx8",
}
local elem_sizes = { [1] = 4, [2] = 4, [3] = 4, [4] = 2, [5] = 2, [6] = 8 }
local abort_reasons = {
  [1] = "rank_left",
  [2] = "idle",
  [3] = "shutdown",
  [4] = "operator",
  [5] = "mismatch",
  [6] = "uplink",
}
local FLAG_VERSION, FLAG_RETX, FLAG_UNICAST, FLAG_LAST, FLAG_SUM, FLAG_DSACK = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
local FLAG_PARTIAL = 0x40 -- RESULT: closed at its deadline; 8 bytes of contributors follow the payload (3.1)
local FLAG_CONCEDE = 0x80 -- DATA: the header alone, its sender arrives at the round without contributing (3.1)
local GS_PARTIAL_TRAILER_BYTES = 8
local flag_names = {
  { FLAG_RETX, "RETX" },
  { FLAG_UNICAST, "UNICAST" },
  { FLAG_LAST, "LAST" },
  { FLAG_SUM, "SUM" },
  { FLAG_DSACK, "DSACK" },
  { FLAG_PARTIAL, "PARTIAL" },
  { FLAG_CONCEDE, "CONCEDE" },
}

local gs = Proto("gradswitch", "gradswitch in-network allreduce")

local f = {
  magic = ProtoField.uint16("gradswitch.magic", "Magic", base.HEX),
  version = ProtoField.uint8("gradswitch.version", "Version", base.DEC),
  type = ProtoField.uint8("gradswitch.type", "Type", base.DEC, msg_types),
  job_id = ProtoField.uint32("gradswitch.job_id", "Job id", base.HEX_DEC),
  key = ProtoField.uint32("gradswitch.key", "Key", base.HEX),
  rank = ProtoField.uint16("gradswitch.rank", "Rank", base.DEC, { [GS_RANK_ALL] = "all" }),
  slot = ProtoField.uint16("gradswitch.slot", "Slot", base.DEC),
  flags = ProtoField.uint8("gradswitch.flags", "Flags", base.HEX),
  flag_version = ProtoField.uint8("gradswitch.flags.version", "Slot version", base.DEC, nil, FLAG_VERSION),
  flag_retx = ProtoField.bool("gradswitch.flags.retx", "Retransmission (RETX)", 8, nil, FLAG_RETX),
  flag_unicast = ProtoField.bool("gradswitch.flags.unicast", "Answer to a retransmission (UNICAST)", 8, nil,
    FLAG_UNICAST),
  flag_last = ProtoField.bool("gradswitch.flags.last", "Last chunk of the tensor (LAST)", 8, nil, FLAG_LAST),
  flag_sum = ProtoField.bool("gradswitch.flags.sum", "Finished sum (SUM, ring)", 8, nil, FLAG_SUM),
  flag_dsack = ProtoField.bool("gradswitch.flags.dsack", "The switch already held this contribution (DSACK)", 8,
    nil, FLAG_DSACK),
  flag_partial = ProtoField.bool("gradswitch.flags.partial", "Closed at its deadline without every rank (PARTIAL)",
    8, nil, FLAG_PARTIAL),
  flag_concede = ProtoField.bool("gradswitch.flags.concede",
    "Arrives at the round without contributing, no payload (CONCEDE)", 8, nil, FLAG_CONCEDE),
  elem_type = ProtoField.uint8("gradswitch.elem_type", "Element type", base.DEC, elem_types),
  count = ProtoField.uint16("gradswitch.count", "Count", base.DEC),
  seq = ProtoField.uint32("gradswitch.seq", "Allreduce seq", base.DEC),
  offset = ProtoField.uint32("gradswitch.offset", "Offset (elements)", base.DEC),
  next_exp = ProtoField.int8("gradswitch.next_exp", "Next exponent", base.DEC),
  abort_reason = ProtoField.uint8("gradswitch.abort_reason", "Abort reason", base.DEC, abort_reasons),
  scale_exp = ProtoField.int8("gradswitch.scale_exp", "Scale exponent", base.DEC),
  reserved = ProtoField.uint16("gradswitch.reserved", "Reserved", base.HEX),
  window = ProtoField.uint16("gradswitch.window",
    "Window (DATA: rounds its sender allows in flight; RESULT: the smallest its round's DATA declared)",
    base.DEC),
  payload = ProtoField.bytes("gradswitch.payload", "Payload"),
  contributors = ProtoField.uint64("gradswitch.contributors",
    "Contributors (HELD: the ranks the round holds; a receiver not among them resends)", base.HEX),
  elements = ProtoField.none("gradswitch.elements", "Elements"),
  int32 = ProtoField.int32("gradswitch.int32", "int32", base.DEC),
  float32 = ProtoField.float("gradswitch.float32", "float32"),
  fixed32 = ProtoField.int32("gradswitch.fixed32", "fixed32", base.DEC),
  fixed32_value = ProtoField.double("gradswitch.fixed32_value", "fixed32 value"),
  float16 = ProtoField.float("gradswitch.float16", "float16"),
  bfloat16 = ProtoField.float("gradswitch.bfloat16", "bfloat16"),
  float64 = ProtoField.double("gradswitch.float64", "float64"),
}
gs.fields = f

local e = {
  length = ProtoExpert.new("gradswitch.bad_length", "Datagram length is not 32 + count x element size",
    expert.group.MALFORMED, expert.severity.ERROR),
  short = ProtoExpert.new("gradswitch.short", "Shorter than the 32-byte header", expert.group.MALFORMED,
    expert.severity.ERROR),
  elem = ProtoExpert.new("gradswitch.bad_elem_type", "Unknown element type", expert.group.MALFORMED,
    expert.severity.ERROR),
  mtype = ProtoExpert.new("gradswitch.bad_type", "Unknown message type", expert.group.MALFORMED,
    expert.severity.ERROR),
  reserved = ProtoExpert.new("gradswitch.reserved_set", "Reserved field is not 0", expert.group.PROTOCOL,
    expert.severity.WARN),
  retx = ProtoExpert.new("gradswitch.retransmission", "Retransmission", expert.group.SEQUENCE,
    expert.severity.NOTE),
  abort = ProtoExpert.new("gradswitch.abort", "The switch aborted the job", expert.group.RESPONSE_CODE,
    expert.severity.WARN),
}
gs.experts = { e.length, e.short, e.elem, e.mtype, e.reserved, e.retx, e.abort }

gs.prefs.max_elements = Pref.uint("Elements shown per packet", 64,
  "How many elements of a packet are added to the tree (the rest is summarised)")

-- The bits of a binary floating-point number of exp_bits exponent and mant_bits mantissa bits (IEEE
-- binary16: 5 and 10; bfloat16, the upper half of a binary32: 8 and 7) to a number.
local function float_bits_to_number(bits, exp_bits, mant_bits)
  local sign_bit = 2 ^ (exp_bits + mant_bits)
  local sign = bit32.band(bits, sign_bit) ~= 0 and -1 or 1
  local exp_max = 2 ^ exp_bits - 1
  local exp = bit32.band(bit32.rshift(bits, mant_bits), exp_max)
  local mant = bit32.band(bits, 2 ^ mant_bits - 1)
  local bias = 2 ^ (exp_bits - 1) - 1
  if exp == 0 then return sign * math.ldexp(mant, 1 - bias - mant_bits) end
  if exp == exp_max then
    if mant == 0 then return sign * math.huge end
    return 0 / 0
  end
  return sign * math.ldexp(mant + 2 ^ mant_bits, exp - bias - mant_bits)
end

-- Adds fields[name] over tvb(offset, length) for each { name, offset, length } of layout, in its order;
-- returns the items by name.
local function add_layout(root, fields, tvb, layout)
  local items = {}
  for _, l in ipairs(layout) do
    items[l[1]] = root:add(fields[l[1]], tvb(l[2], l[3]))
  end
  return items
end

-- The header's fields up to the exponents, { name in f, offset, length } (docs/protocol.md section 2).
local header_layout = {
  { "magic", 0, 2 }, { "version", 2, 1 }, { "type", 3, 1 }, { "job_id", 4, 4 }, { "key", 8, 4 },
  { "rank", 12, 2 }, { "slot", 14, 2 }, { "flags", 16, 1 }, { "elem_type", 17, 1 }, { "count", 18, 2 },
  { "seq", 20, 4 }, { "offset", 24, 4 },
}
-- The bit fields shown under the flags byte.
local flag_fields = {
  "flag_version", "flag_retx", "flag_unicast", "flag_last", "flag_sum", "flag_dsack", "flag_partial", "flag_concede",
}

local function flags_text(flags)
  local out = {}
  for _, fl in ipairs(flag_names) do
    if bit32.band(flags, fl[1]) ~= 0 then out[#out + 1] = fl[2] end
  end
  return table.concat(out, ",")
end

-- The elements of the payload, little-endian, as their type; at most max_elements of them.
local function add_elements(tree, tvb, elem, count, scale_exp)
  local size = elem_sizes[elem]
  if elem == 7 then -- mx8: blocks of a scale byte and 32 E4M3 bytes (docs/protocol.md 2.2), shown as bytes
    local bytes = math.min(count + math.floor((count + 31) / 32), tvb:len() - GS_HEADER_BYTES)
    if bytes > 0 then
      tree:add(f.elements, tvb(GS_HEADER_BYTES, bytes)):set_text(string.format("Elements: %d mx8 (%d bytes)", count, bytes))
    end
    return
  end
  local shown = math.min(count, gs.prefs.max_elements)
  local sub = tree:add(f.elements, tvb(GS_HEADER_BYTES, count * size))
  sub:set_text(string.format("Elements: %d %s", count, elem_types[elem]))
  for i = 0, shown - 1 do
    local r = tvb(GS_HEADER_BYTES + i * size, size)
    if elem == 1 then
      sub:add_le(f.int32, r)
    elseif elem == 2 then
      sub:add_le(f.float32, r)
    elseif elem == 3 then
      local q = r:le_int()
      local item = sub:add_le(f.fixed32, r)
      if scale_exp ~= GS_EXP_NONE then
        local v = math.ldexp(q, -scale_exp)
        item:append_text(string.format(" (%.9g)", v))
        sub:add(f.fixed32_value, r, v):set_generated()
      end
    elseif elem == 4 then
      sub:add(f.float16, r, float_bits_to_number(r:le_uint(), 5, 10))
    elseif elem == 5 then
      sub:add(f.bfloat16, r, float_bits_to_number(r:le_uint(), 8, 7))
    elseif elem == 6 then
      sub:add_le(f.float64, r)
    end
  end
  if shown < count then
    sub:add(string.format("... %d more (preference gradswitch.max_elements)", count - shown))
  end
end

local function info_text(mtype, job_id, rank, slot, flags, elem, count, seq, offset, next_exp)
  local name = msg_types[mtype] or ("type " .. mtype)
  if mtype == 3 then
    return string.format("ABORT job 0x%08x reason %s rank %s", job_id,
      abort_reasons[next_exp] or tostring(next_exp), rank == GS_RANK_ALL and "-" or tostring(rank))
  end
  local who = rank == GS_RANK_ALL and "all" or tostring(rank)
  if mtype == 6 then return string.format("RING_DONE job 0x%08x rank %s seq %d", job_id, who, seq) end
  local s = string.format("%s job 0x%08x rank %s slot %d v%d seq %d off %d n %d %s", name, job_id, who, slot,
    bit32.band(flags, FLAG_VERSION), seq, offset, count, elem_types[elem] or ("elem " .. elem))
  local fl = flags_text(flags)
  if fl ~= "" then s = s .. " [" .. fl .. "]" end
  return s
end

-- Decodes a datagram already known (or asserted) to be gradswitch; returns the bytes consumed.
local function dissect(tvb, pinfo, tree)
  local len = tvb:len()
  pinfo.cols.protocol = "GRADSWITCH"
  local root = tree:add(gs, tvb())
  if len < GS_HEADER_BYTES then
    root:add_proto_expert_info(e.short)
    pinfo.cols.info = "gradswitch (short)"
    return len
  end
  local mtype = tvb(3, 1):uint()
  local job_id = tvb(4, 4):uint()
  local rank = tvb(12, 2):uint()
  local slot = tvb(14, 2):uint()
  local flags = tvb(16, 1):uint()
  local elem = tvb(17, 1):uint()
  local count = tvb(18, 2):uint()
  local seq = tvb(20, 4):uint()
  local offset = tvb(24, 4):uint()
  local next_exp = tvb(28, 1):int()
  local scale_exp = tvb(29, 1):int()

  local items = add_layout(root, f, tvb, header_layout)
  if not msg_types[mtype] then items.type:add_proto_expert_info(e.mtype) end
  if mtype == 2 then items.rank:append_text(" (the completer: its DATA completed the round)") end
  local fl = items.flags
  local names = flags_text(flags)
  if names ~= "" then fl:append_text(" (" .. names .. ")") end
  for _, k in ipairs(flag_fields) do fl:add(f[k], tvb(16, 1)) end
  if bit32.band(flags, FLAG_RETX) ~= 0 then fl:add_proto_expert_info(e.retx) end
  local elem_item = items.elem_type
  if mtype == 3 then
    root:add(f.abort_reason, tvb(28, 1)):add_proto_expert_info(e.abort)
  else
    local item = root:add(f.next_exp, tvb(28, 1))
    if next_exp == GS_EXP_NONE then item:append_text(" (none)") end
  end
  local scale_item = root:add(f.scale_exp, tvb(29, 1))
  if scale_exp == GS_EXP_NONE then scale_item:append_text(" (none)") end
  if mtype == 1 or mtype == 2 then
    root:add(f.window, tvb(30, 2))
  else
    local reserved_item = root:add(f.reserved, tvb(30, 2))
    if tvb(30, 2):uint() ~= 0 then reserved_item:add_proto_expert_info(e.reserved) end
  end

  local size = elem_sizes[elem]
  -- A DATA with CONCEDE is the header alone: its count names the chunk, not elements that follow.
  local concede = mtype == 1 and bit32.band(flags, FLAG_CONCEDE) ~= 0
  local has_elements = mtype ~= 3 and mtype ~= 6 and mtype ~= 7 and not concede
  local body = mtype == 7 and GS_HELD_BODY_BYTES or 0
  local trailer = (mtype == 2 and bit32.band(flags, FLAG_PARTIAL) ~= 0) and GS_PARTIAL_TRAILER_BYTES or 0
  if has_elements and not size then
    elem_item:add_proto_expert_info(e.elem)
  elseif has_elements and len ~= GS_HEADER_BYTES + count * size + trailer then
    root:add_proto_expert_info(e.length, string.format("Datagram is %d bytes; 32 + %d x %d + %d = %d expected",
      len, count, size, trailer, GS_HEADER_BYTES + count * size + trailer))
  elseif not has_elements and len ~= GS_HEADER_BYTES + body then
    root:add_proto_expert_info(e.length, string.format("%s%s carries %d bytes after the header; the datagram is %d",
      msg_types[mtype], concede and " with CONCEDE" or "", body, len))
  end
  if body > 0 and len == GS_HEADER_BYTES + body then
    root:add(f.contributors, tvb(GS_HEADER_BYTES, body))
  elseif trailer > 0 and len >= GS_HEADER_BYTES + trailer then
    root:add(f.payload, tvb(GS_HEADER_BYTES, len - GS_HEADER_BYTES - trailer))
    root:add(f.contributors, tvb(len - trailer, trailer)):append_text(" (PARTIAL: the ranks in this sum)")
  elseif len > GS_HEADER_BYTES then
    root:add(f.payload, tvb(GS_HEADER_BYTES))
  end
  if has_elements and size and count > 0 and len >= GS_HEADER_BYTES + count * size then
    add_elements(root, tvb, elem, count, scale_exp)
  end
  pinfo.cols.info = info_text(mtype, job_id, rank, slot, flags, elem, count, seq, offset, next_exp)
  return len
end

function gs.dissector(tvb, pinfo, tree)
  return dissect(tvb, pinfo, tree)
end

-- The heuristic: magic "GS", version 2, a known message type.
local function heuristic(tvb, pinfo, tree)
  if tvb:len() < GS_HEADER_BYTES then return false end
  if tvb(0, 2):uint() ~= GS_MAGIC or tvb(2, 1):uint() ~= GS_VERSION then return false end
  if not msg_types[tvb(3, 1):uint()] then return false end
  dissect(tvb, pinfo, tree)
  return true
end
gs:register_heuristic("udp", heuristic)
DissectorTable.get("udp.port"):add_for_decode_as(gs)

-- ---- The DPDK switch's completion signal (include/gradswitch/notify.h) ----

local GS_NOTIFY_MAGIC = 0x4753434E -- "GSCN"
local GS_NOTIFY_BYTES = 32
local notify_reasons = { [1] = "newer_seq", [2] = "quiet" }

local gsn = Proto("gradswitch_notify", "gradswitch completion signal")
local nf = {
  magic = ProtoField.uint32("gradswitch_notify.magic", "Magic", base.HEX),
  version = ProtoField.uint8("gradswitch_notify.version", "Version", base.DEC),
  reason = ProtoField.uint8("gradswitch_notify.reason", "Reason", base.DEC, notify_reasons),
  reserved = ProtoField.uint16("gradswitch_notify.reserved", "Reserved", base.HEX),
  job_id = ProtoField.uint32("gradswitch_notify.job_id", "Job id", base.HEX_DEC),
  seq = ProtoField.uint32("gradswitch_notify.seq", "Complete up to seq", base.DEC),
  elements = ProtoField.uint64("gradswitch_notify.elements", "Result elements of that seq", base.DEC),
  last_result_ns = ProtoField.uint64("gradswitch_notify.last_result_ns", "Latest result (switch clock, ns)",
    base.DEC),
}
gsn.fields = nf
local ne_length = ProtoExpert.new("gradswitch_notify.bad_length", "A completion signal is 32 bytes",
  expert.group.MALFORMED, expert.severity.ERROR)
gsn.experts = { ne_length }

-- The completion signal's fields, { name in nf, offset, length } (include/gradswitch/notify.h).
local notify_layout = {
  { "magic", 0, 4 }, { "version", 4, 1 }, { "reason", 5, 1 }, { "reserved", 6, 2 }, { "job_id", 8, 4 },
  { "seq", 12, 4 }, { "elements", 16, 8 }, { "last_result_ns", 24, 8 },
}

local function dissect_notify(tvb, pinfo, tree)
  pinfo.cols.protocol = "GRADSWITCH"
  local root = tree:add(gsn, tvb())
  if tvb:len() ~= GS_NOTIFY_BYTES then root:add_proto_expert_info(ne_length) end
  if tvb:len() < GS_NOTIFY_BYTES then return tvb:len() end
  add_layout(root, nf, tvb, notify_layout)
  pinfo.cols.info = string.format("COMPLETE job 0x%08x seq %d (%s)", tvb(8, 4):uint(), tvb(12, 4):uint(),
    notify_reasons[tvb(5, 1):uint()] or "?")
  return tvb:len()
end

function gsn.dissector(tvb, pinfo, tree)
  return dissect_notify(tvb, pinfo, tree)
end
gsn:register_heuristic("udp", function(tvb, pinfo, tree)
  if tvb:len() < 8 or tvb(0, 4):uint() ~= GS_NOTIFY_MAGIC or tvb(4, 1):uint() ~= 1 then return false end
  dissect_notify(tvb, pinfo, tree)
  return true
end)
DissectorTable.get("udp.port"):add_for_decode_as(gsn)
