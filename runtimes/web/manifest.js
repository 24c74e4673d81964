// A web package's manifest checked before any file is fetched (format, version, target, file
// records, a decoder's conditioning), and the SHA-256 digest files are checked against; the
// checks the Python runtime makes (edge/core/manifest_schema.py, runtimes/python/
// package_checks.py) with its messages.

import { Tiling, tileVariant } from "./tiles.js";

export const FORMAT = "edge-package";
export const FORMAT_VERSION = 1;

export class PackageError extends Error {}

function hex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function sha256Hex(buffer) {
  return hex(await crypto.subtle.digest("SHA-256", buffer));
}

// Every file record in the manifest, as the Python side lists them (edge/core/manifest_schema.py).
export function fileRecords(manifest) {
  const out = [...manifest.tokenizer.files, ...Object.values(manifest.conditioning)];
  for (const c of manifest.components) for (const b of c.blocks) out.push(...b.files);
  const seen = new Set();
  return out.filter((r) => !seen.has(r.path) && seen.add(r.path));
}

export function checkManifest(manifest, url) {
  const where = `${url}`;
  if (manifest.format !== FORMAT) {
    throw new PackageError(`${where}: not an edge package ` +
                           `(format ${JSON.stringify(manifest.format)})`);
  }
  if (manifest.format_version !== FORMAT_VERSION) {
    throw new PackageError(`${where}: format_version ${manifest.format_version}; ` +
                           `this runtime reads version ${FORMAT_VERSION}`);
  }
  if (manifest.target !== "web") {
    throw new PackageError(`${where}: target ${JSON.stringify(manifest.target)}; the web ` +
                           `runtime runs "web" packages (export with: edge export --target web)`);
  }
  // optional (older packages lack it): what a seed means; a seed is only drawn for the
  // definition noise.js draws (checkNoise, at generate)
  if ("noise" in manifest && typeof manifest.noise !== "string") {
    throw new PackageError(`${where}: field 'noise' must be a string (the ` +
                           `seeds' definition, e.g. "torch.randn/cpu/float32"), ` +
                           `got ${JSON.stringify(manifest.noise)}`);
  }
  // optional: how the null caption is masked (absent: every token; "prompt": Open-Sora's)
  if ("null_caption_mask" in manifest && !["all", "prompt"].includes(manifest.null_caption_mask)) {
    throw new PackageError(`${where}: field 'null_caption_mask' ` +
                           `is ${JSON.stringify(manifest.null_caption_mask)}; known: all, prompt`);
  }
  checkDecode(manifest, where);
  checkTiles(manifest, where);
  for (const r of fileRecords(manifest)) {
    if (typeof r.path !== "string" || r.path.startsWith("/")
        || r.path.split("/").some((p) => p === ".." || p === "." || p === "")) {
      throw new PackageError(
        `${where}: file path ${JSON.stringify(r.path)} escapes the package folder`);
    }
  }
}

const DECODE_INPUTS = ["decode_noise", "decode_noise_scale", "decode_t"];

// A decoder that takes the decode inputs needs the manifest's `decode` settings and runs on
// whole videos; a manifest with them has such a decoder (the Python runtime's check_decode).
function checkDecode(manifest, where) {
  const decoder = (manifest.components || []).find((c) => c.name === "vae_decoder");
  const names = new Set(
    (decoder?.blocks || []).flatMap((b) => (b.inputs || []).map((s) => s.name)));
  const takes = DECODE_INPUTS.filter((n) => names.has(n));
  const spec = manifest.decode;
  if (spec === undefined && !takes.length) return;
  if (spec === undefined) {
    throw new PackageError(`${where}: the vae_decoder takes ${takes.join(", ")} ` +
                           "but the manifest has no 'decode' settings");
  }
  if (takes.length !== DECODE_INPUTS.length || decoder.chunked
      || manifest.latent_layout !== "video") {
    throw new PackageError(`${where} decode: needs a whole-video vae_decoder (latent_layout ` +
                           `'video', not chunked) taking ${DECODE_INPUTS.join(", ")}`);
  }
  const number = (v) => typeof v === "number" && Number.isFinite(v);
  if (spec === null || typeof spec !== "object" || !number(spec.timestep)
      || !(spec.noise_scale === null || spec.noise_scale === undefined
           || number(spec.noise_scale))) {
    throw new PackageError(`${where} decode: must be {"timestep": number, ` +
                           `"noise_scale": number or null}, got ${JSON.stringify(spec)}`);
  }
}

// A decoder in tiles (edge/core/manifest_schema.py _check_tiles): its blocks traced at the
// first tile of the latents, with a program for every other tile size they need
function checkTiles(manifest, where) {
  const decoder = (manifest.components || []).find((c) => c.name === "vae_decoder");
  if (!decoder?.tiles) return;
  const [h, w] = manifest.latent_shape.slice(-2);
  const sizes = new Tiling(decoder.tiles).tileSizes(h, w);
  const head = decoder.blocks[0];
  const traced = head.inputs.find((s) => s.shape.length === 5)?.shape.slice(-2);
  if (!traced || traced.join("x") !== sizes[0].join("x")) {
    throw new PackageError(`${where} vae_decoder tiles: block ${head.name} takes latents of ` +
                           `${traced?.join("x")}, not the first tile's ${sizes[0].join("x")}`);
  }
  const first = decoder.chunked?.first_variant ?? null;
  for (const b of decoder.blocks) {
    for (const size of sizes.slice(1)) {
      for (const v of new Set([null, first])) {
        const name = tileVariant(v, size, sizes[0]);
        if (!(name in (b.variants || {}))) {
          throw new PackageError(`${where} vae_decoder tiles: block ${b.name} has no variant ` +
                                 `'${name}' for the tiles of ${size.join("x")} latents`);
        }
      }
    }
  }
}
