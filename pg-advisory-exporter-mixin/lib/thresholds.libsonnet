// How alerts.libsonnet writes a threshold of _config, as exporter/alerting/rules.py writes it
// for `pg-advisory-exporter rules`: a duration is seconds (900) or in Prometheus' grammar
// ('15m', '1m30s', '500ms', '1w'), the forms the command's --set takes, and is written as
// exporter/schema.py's format_duration writes it. The Helm chart's _rules.tpl does the same
// in Go templates; tests/test_mixin.py renders both forms against the command's output.

// Prometheus' units in milliseconds, largest first; a year is 365 days, as there.
local units = [
  ['y', 365 * 86400000],
  ['w', 7 * 86400000],
  ['d', 86400000],
  ['h', 3600000],
  ['m', 60000],
  ['s', 1000],
  ['ms', 1],
];
local unitIndex = { [units[i][0]]: i for i in std.range(0, std.length(units) - 1) };
// Prometheus writes a year or a week only for a whole number of them ('90d', not '12w6d').
local wholeOnly = ['y', 'w'];

local isDigit(c) = std.codepoint(c) >= 48 && std.codepoint(c) <= 57;

// The first position from `i` on whose character is not `wanted(c)`.
local skip(text, i, wanted) =
  if i < std.length(text) && wanted(text[i]) then skip(text, i + 1, wanted) else i;

// Half to even, as Python's round() and its formatting of a number round.
local roundEven(x) =
  local whole = std.floor(x), rest = x - whole;
  if rest > 0.5 || (rest == 0.5 && whole % 2 == 1) then whole + 1 else whole;

local forms = 'use seconds or a form like 500ms, 5s, 1m30s';
local refuse(value, why) =
  error 'pg-advisory-exporter mixin: %s is not a duration: %s' % [std.manifestJson(value), why];

// Seconds from text of digits with an optional fraction ('30', '1.5'), as exactly as Python's
// float() reads it: one division of two whole numbers is rounded once; null for other text.
local numberText(text) =
  local parts = std.split(text, '.');
  local digitsOnly(part) = part != '' && skip(part, 0, isDigit) == std.length(part);
  local fraction = if std.length(parts) == 2 then parts[1] else '';
  if std.length(parts) <= 2 && std.all(std.map(digitsOnly, parts)) then
    std.parseInt(parts[0] + fraction) / std.pow(10, std.length(fraction))
  else null;

// Milliseconds of Prometheus' grammar: whole numbers each with a unit, the units from the
// largest to the smallest, each at most once ('0' alone is Prometheus' one number without).
local prometheusMilliseconds(text) =
  local parse(i, next, total) =
    if i == std.length(text) then total
    else
      local digitsEnd = skip(text, i, isDigit);
      local unitEnd = skip(text, digitsEnd, function(c) !isDigit(c));
      local unit = std.substr(text, digitsEnd, unitEnd - digitsEnd);
      if digitsEnd == i || !std.objectHas(unitIndex, unit) || unitIndex[unit] < next then
        refuse(text, forms + ' (the units from y to ms, largest first, each at most once)')
      else
        local count = std.parseInt(std.substr(text, i, digitsEnd - i));
        parse(unitEnd, unitIndex[unit] + 1, total + count * units[unitIndex[unit]][1]);
  if text == '0' then 0 else if text == '' then refuse(text, forms) else parse(0, 0, 0);

// A duration of _config in seconds: a number as it is, text as parse_duration reads it.
local toSeconds(value) =
  local seconds =
    if std.isNumber(value) then value
    else if std.isString(value) then
      local text = std.stripChars(value, ' \t\n\r');
      local number = numberText(text);
      if number != null then number else prometheusMilliseconds(text) / 1000
    else refuse(value, forms);
  if seconds > 0 then seconds else refuse(value, 'it must be longer than 0');

// A number as Python's '%g' writes it (format_number): 900, 0.5, 1.2096e+06. jsonnet's '%g'
// differs only from 1e21 up and where rounding to six digits carries (999999.5).
local number(value) = std.format('%g', value);

{
  // A duration as seconds, for PromQL: 900.
  seconds(value):: number(toSeconds(value)),

  // A duration as Prometheus writes it, for `for` and for people: 15m, 1h30m, 500ms.
  duration(value)::
    local milliseconds = roundEven(toSeconds(value) * 1000);
    local step(state, unit) =
      local size = unit[1], left = state.left;
      if std.member(wholeOnly, unit[0]) && left % size != 0 then state
      else
        local count = (left - left % size) / size;
        local written = if count > 0 then '%d%s' % [count, unit[0]] else '';
        { left: left % size, text: state.text + written };
    if milliseconds == 0 then '0s'
    else std.foldl(step, units, { left: milliseconds, text: '' }).text,

  // A share, or a number of a float threshold: 0.6, 2.5.
  number(value):: number(value),

  // A share as a percentage: 60%.
  percent(value):: '%d%%' % roundEven(value * 100),

  // The group labels, each after a comma: ', namespace, pod, cluster'.
  groupLabels(labels):: std.join('', [', ' + label for label in labels]),

  // The `selector`'s matchers after a metric's own ('{job="x", cluster="eu-1"}'), or alone.
  selectorAfter(selector):: if selector == '' then '' else ', ' + selector,
  selectorAlone(selector):: if selector == '' then '' else '{' + selector + '}',
}
