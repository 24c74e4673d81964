// Sizes as edge reads and writes them (edge/core/budget.py): binary units throughout. A size
// given as 64MB, 64MiB or 64M is 64 x 2^20 bytes; sizes are written in KiB, MiB and GiB.

// edge/core/budget.py parse_size: '64MB', '1.5GiB', '512k', 1000 -> bytes (powers of 1024 for
// every unit); anything else (not finite, not positive, under a byte, past 2^60, another
// type) refused naming the value
const SIZE_UNITS = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };
const MAX_SIZE = 2 ** 60;

export function parseSize(value) {
  if (value === null || value === undefined || value === "") return null;
  const what = `memory budget ${JSON.stringify(value)}`;
  let number, factor = 1;
  if (typeof value === "number") {
    if (!Number.isInteger(value)) {
      throw new Error(`${what}: a number of bytes is a whole number; or give a size such as ` +
                      "'64MB'");
    }
    number = value;
  } else if (typeof value === "string") {
    let s = value.trim().toUpperCase();
    if (s.endsWith("B")) s = s.slice(0, -1);
    if (s.endsWith("I")) s = s.slice(0, -1);
    if (s.slice(-1) in SIZE_UNITS) {
      factor = SIZE_UNITS[s.slice(-1)];
      s = s.slice(0, -1);
    }
    s = s.trim();
    if (/^[+-]?(?:INF|INFINITY|NAN)$/.test(s)) {  // numbers to Python's float(), not sizes
      throw new Error(`${what}: must be a finite size, e.g. 64MB or 1.5GB`);
    }
    if (!/^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:E[+-]?\d+)?$/.test(s)) {
      throw new Error(`${what}: not understood; use e.g. 64MB or 1.5GB`);
    }
    number = Number(s);
    if (!Number.isFinite(number)) {  // 1e999
      throw new Error(`${what}: must be a finite size, e.g. 64MB or 1.5GB`);
    }
  } else {
    throw new Error(`${what} is ${Array.isArray(value) ? "a list" : `a ${typeof value}`}; give ` +
                    "a whole number of bytes or a size such as '64MB'");
  }
  if (number <= 0) throw new Error(`${what}: must be positive`);
  if (number * factor > MAX_SIZE) {
    throw new Error(`${what}: more than 1 EiB, beyond any machine's memory`);
  }
  const size = Math.floor(number * factor);
  if (size < 1) throw new Error(`${what}: less than one byte`);
  return size;
}

// edge/core/budget.py format_size: 1.5 GiB, 64.0 MiB, 3.0 KiB, 512 B
export function formatSize(n) {
  for (const [unit, factor] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (n >= factor) return `${(n / factor).toFixed(1)} ${unit}`;
  }
  return `${n} B`;
}
