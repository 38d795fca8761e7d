-- STOW-RS for wrk with a new study per request (benchmarks/nodes.py runs it):
--
--   wrk -t2 -c16 -d10s -s stow_studies.lua http://127.0.0.1:8080 -- BODY POST_PATH PH_STUDY PH_SERIES PH_SOP RUNID
--
-- BODY is one multipart/related STOW-RS body holding one instance whose Study, Series
-- and SOP Instance UIDs are the 44-character placeholders PH_*; every request gets
-- three new 44-character UIDs (run id, thread, counter), so each request is a new
-- study: nodes meet on the index and the folder, not on one study's lock (as with
-- loadtests/wrk/load03.lua, whose threads each fill one study).
-- An answer counts as good when it is 200 with a ReferencedSOPSequence (00081199) and no
-- FailureReason (00081197). done() prints "STOW {json}".

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local segments, kinds, hdr, post_path, runid, seq

function init(args)
  local f = assert(io.open(args[1], "rb"))
  local body = f:read("*a")
  f:close()
  post_path = args[2]
  local ph = {args[3], args[4], args[5]}
  runid = tonumber(args[6] or "0") % 1000000
  segments, kinds = {}, {}
  local pos = 1
  while true do
    local best, bk, be
    for k = 1, 3 do
      local a, b = string.find(body, ph[k], pos, true)
      if a and (not best or a < best) then best, bk, be = a, k, b end
    end
    if not best then break end
    segments[#segments + 1] = string.sub(body, pos, best - 1)
    kinds[#kinds + 1] = bk
    pos = be + 1
  end
  segments[#segments + 1] = string.sub(body, pos)
  local boundary = string.match(body, "^%-%-([^\r\n]+)")
  hdr = {["Content-Type"] = 'multipart/related; type="application/dicom"; boundary=' .. boundary,
         ["Accept"] = "application/dicom+json"}
  bad = 0
  seq = 0
end

function request()
  seq = seq + 1
  local parts = {}
  for j = 1, #kinds do
    parts[#parts + 1] = segments[j]
    parts[#parts + 1] = string.format("2.25.1%06d%03d%d%028d", runid, tid, kinds[j], seq)
  end
  parts[#parts + 1] = segments[#segments]
  return wrk.format("POST", post_path, hdr, table.concat(parts))
end

function response(status, headers, body)
  if status < 200 or status > 299 then return end
  local ok = status == 200 and string.find(body, '"00081199"', 1, true) ~= nil
             and string.find(body, '"00081197"', 1, true) == nil
  if not ok then bad = bad + 1 end
end

function done(summary, latency, requests)
  local invalid = 0
  for _, t in ipairs(threads) do invalid = invalid + (t:get("bad") or 0) end
  local e = summary.errors
  io.write(string.format(
    'STOW {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"invalid":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    invalid, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
