-- Answers of known size, for wrk without a response() function: python -m loadtests.capacity
-- runs it for the "wado" (WADO-RS instance) and "study" (whole-study retrieve) operations.
--
--   wrk -t2 -c8 -d15s -s sized.lua http://127.0.0.1:8080 -- FILE ACCEPT RUNID
--
-- FILE: one line per request, "PATH<TAB>BYTES": the request path and the exact size of the
-- whole HTTP answer (status line, headers and body) that loadtests.study measured and fully
-- validated (every part parsed, every SOP Instance asked for present once, its pixel data
-- the original's SHA-256) just before the step. Each thread cycles through the list from its
-- own offset.
--
-- Why no response(): wrk copies every body into a Lua string for response() (it only
-- sets http_parser's on_body callback when the script defines one): ~10 MB per study
-- answer made wrk the bottleneck at ~860 MB/s; for WADO-RS instance answers (130-520 KB)
-- wrk spent 0.51 ms of CPU per answer with it and 0.20 ms without, most of it system time:
-- each body's Lua string is a fresh mapping (an mmap and a munmap per answer, ~100 page
-- faults; strace and perf stat, 2026-12-07), so on 2 cores wrk held down the rate of the
-- server it measured. Without it wrk reads in 8 KiB pieces and only frames the answers.
-- What is checked per answer, then:
--   * wrk counts an answer only when http_parser has read all of it: Content-Length
--     bytes, or the chunked terminator; a connection closed earlier is a read error.
--     (A body delimited by the connection's close, as Orthanc sends multipart answers,
--     is "complete" at the close: one request plus one read error per answer in wrk;
--     loadtests.study accounts for that.)
--   * status >= 400 is counted by wrk (errors.status).
--   * bytes: request() adds the expected size of every answer it asks for; done()
--     prints it, and loadtests.study checks that wrk's byte count lies between the
--     expected bytes of the answers completed and those of every request sent (a
--     short, long or wrong answer moves the count out of that window).
-- done() prints one line "LOAD03 {json}" like load03.lua, plus "sent" and "sent_bytes".

local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

local paths, sizes, n, i, hdr

function init(args)
  paths, sizes = {}, {}
  for line in io.lines(args[1]) do
    local p, s = string.match(line, "^([^\t]+)\t(%d+)$")
    if p then
      paths[#paths + 1] = p
      sizes[#sizes + 1] = tonumber(s)
    end
  end
  n = #paths
  assert(n > 0, "no study paths in " .. args[1])
  i = math.floor((tid - 1) * n / 16) % n  -- threads start at different places
  hdr = {["Accept"] = args[2]}
  sent = 0        -- globals: done() reads them with thread:get
  sent_bytes = 0
end

function request()
  i = i % n + 1
  sent = sent + 1
  sent_bytes = sent_bytes + sizes[i]
  return wrk.format("GET", paths[i], hdr)
end

function done(summary, latency, requests)
  local s, sb = 0, 0
  for _, t in ipairs(threads) do
    s = s + (t:get("sent") or 0)
    sb = sb + (t:get("sent_bytes") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'LOAD03 {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"invalid":0,"sent":%d,"sent_bytes":%.0f,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    s, sb, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
