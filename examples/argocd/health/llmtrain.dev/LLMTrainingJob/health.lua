-- Argo CD health check for llmtrain.dev/LLMTrainingJob (Lua 5.1, Argo CD's sandbox: no libraries).
--
--   no status yet / status older than the spec  -> Progressing (the operator has not caught up)
--   a spec change the operator rejected         -> Degraded    (git asks for something not applied)
--   Pending                                     -> Progressing (validated, waiting for workers)
--   Running                                     -> Healthy     (training; progress in the message)
--   Restarting                                  -> Progressing (recovering from a failure or hang
--                                                               within spec.resilience.maxRestarts)
--   Suspended (spec.suspend)                    -> Suspended
--   Succeeded                                   -> Healthy
--   Failed                                      -> Degraded
--   anything else                               -> Unknown
local hs = {}

local function find_condition(status, ctype)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function with_message(prefix, status)
  if status.message ~= nil and status.message ~= "" then
    return prefix .. ": " .. status.message
  end
  return prefix
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the llmtrain operator to accept the job"
  return hs
end

local status = obj.status
local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the llmtrain operator to observe generation " .. generation
  return hs
end

local accepted = find_condition(status, "SpecAccepted")
if accepted ~= nil and accepted.status == "False" then
  hs.status = "Degraded"
  hs.message = "Spec change rejected: " .. (accepted.message or accepted.reason or "see the job's events")
  return hs
end

local phase = status.phase
if phase == "Pending" then
  hs.status = "Progressing"
  hs.message = with_message("Pending", status)
elseif phase == "Running" then
  hs.status = "Healthy"
  local msg = "Running"
  if status.attempt ~= nil then
    msg = msg .. " (attempt " .. status.attempt .. ")"
  end
  local p = status.progress
  if p ~= nil and p.step ~= nil then
    msg = msg .. ", step " .. p.step
    if p.loss ~= nil then
      msg = msg .. string.format(", loss %.3f", p.loss)
    end
    if p.mfu ~= nil then
      msg = msg .. string.format(", MFU %.0f%%", p.mfu * 100)
    end
  end
  hs.message = msg
elseif phase == "Restarting" then
  hs.status = "Progressing"
  hs.message = with_message("Restarting", status)
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = with_message("Suspended", status)
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = with_message("Succeeded", status)
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = with_message("Failed", status)
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(phase)
end
return hs
