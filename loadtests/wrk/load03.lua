-- LOAD-03 for wrk (a C load generator): python -m loadtests.capacity runs it.
--
--   wrk -t2 -c8 -d15s -s load03.lua http://127.0.0.1:8080 -- MODE FILE ARG3 ARG4 RUNID
--
-- MODE qido|wado|rendered: FILE lists one request path per line (full path, with the
--   server's DICOMweb root); each thread cycles through the list from its own offset, so
--   requests spread over the whole data set. ARG3: the Accept header. ARG4: the smallest
--   valid body in bytes (wado).
-- MODE stow: FILE is one multipart/related STOW-RS body whose SOP Instance UID is the
--   placeholder ARG4; ARG3 is the POST path. Each request gets a new 44-character UID
--   (run id, thread, counter), each thread its own study and series UIDs.
--
-- Light checks on every answer (the locust runner does the full validation):
--   qido: a JSON array; wado: at least ARG4 bytes; rendered: SOI ... EOI;
--   stow: ReferencedSOPSequence (00081199) and no failed item (FailureReason 00081197).
-- wrk itself counts non-2xx answers and socket errors. done() prints one line
-- "LOAD03 {json}" with the summary.

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local function replace_plain(s, old, new)
  local out, pos = {}, 1
  while true do
    local a, b = string.find(s, old, pos, true)
    if not a then break end
    out[#out + 1] = string.sub(s, pos, a - 1)
    out[#out + 1] = new
    pos = b + 1
  end
  out[#out + 1] = string.sub(s, pos)
  return table.concat(out)
end

local function split_plain(s, sep)
  local out, pos = {}, 1
  while true do
    local a, b = string.find(s, sep, pos, true)
    if not a then break end
    out[#out + 1] = string.sub(s, pos, a - 1)
    pos = b + 1
  end
  out[#out + 1] = string.sub(s, pos)
  return out
end

local mode, paths, n, i, hdr, minlen, pieces, post_path, uid_prefix, seq

function init(args)
  mode = args[1]
  bad = 0  -- global: done() reads it with thread:get
  seq = 0
  local runid = tonumber(args[5] or "0") % 1000000
  if mode == "stow" then
    local f = assert(io.open(args[2], "rb"))
    local body = f:read("*a")
    f:close()
    post_path = args[3]
    local ph = args[4]
    local function uid(kind, k)
      return string.format("2.25.1%06d%03d%d%028d", runid, tid, kind, k)
    end
    -- the study and series placeholders of loadtests.dataset.stow_template
    body = replace_plain(body, "2.25.1" .. string.rep("1", 38), uid(1, 0))
    body = replace_plain(body, "2.25.1" .. string.rep("2", 38), uid(2, 0))
    uid_prefix = string.format("2.25.1%06d%03d3", runid, tid)
    local boundary = string.match(body, "^%-%-([^\r\n]+)")
    hdr = {["Content-Type"] = 'multipart/related; type="application/dicom"; boundary=' .. boundary,
           ["Accept"] = "application/dicom+json"}
    -- the whole request (request line, headers, body) made once, cut at the placeholder: each
    -- request() then joins the pieces around its UID (the same length: Content-Length holds)
    -- in one string; a body string and a request string per request were two fresh mappings
    -- of LuaJIT's allocator (over its 128 KiB threshold), ~0.1 ms of wrk's CPU per request
    assert(#uid_prefix + 28 == #ph, "the placeholder's length is not the UID's")
    pieces = split_plain(wrk.format("POST", post_path, hdr, body), ph)
  else
    paths = {}
    for line in io.lines(args[2]) do
      if #line > 0 then paths[#paths + 1] = line end
    end
    n = #paths
    i = math.floor((tid - 1) * n / 16) % n  -- threads start at different places
    hdr = {["Accept"] = args[3]}
    minlen = tonumber(args[4] or "1")
  end
end

function request()
  if mode == "stow" then
    seq = seq + 1
    return table.concat(pieces, uid_prefix .. string.format("%028d", seq))
  end
  i = i % n + 1
  return wrk.format("GET", paths[i], hdr)
end

function response(status, headers, body)
  if status < 200 or status > 299 then return end  -- counted by wrk as non-2xx
  local ok
  if mode == "qido" then
    ok = status == 204 or string.sub(body, 1, 1) == "["
  elseif mode == "wado" then
    ok = #body >= minlen
  elseif mode == "rendered" then
    ok = string.sub(body, 1, 2) == "\255\216" and string.sub(body, -2) == "\255\217"
  else
    -- a failed instance is an item with a FailureReason (00081197); some servers send
    -- an empty FailedSOPSequence (00081198) when nothing failed
    ok = status == 200 and string.find(body, '"00081199"', 1, true) ~= nil
         and string.find(body, '"00081197"', 1, true) == nil
  end
  if not ok then bad = bad + 1 end
end

function done(summary, latency, requests)
  local invalid = 0
  for _, t in ipairs(threads) do invalid = invalid + (t:get("bad") or 0) end
  local e = summary.errors
  io.write(string.format(
    'LOAD03 {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"invalid":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    invalid, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
