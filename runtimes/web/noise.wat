;; The bulk of torchRandn (noise.js) in WebAssembly SIMD: MT19937's twist, its tempering and
;; PyTorch's normal_fill_16 four lanes at a time. Assembled into noise_wasm.js by
;; tools/noise_wasm.py (python tools/noise_wasm.py after any change here).
;;
;; Why: the scalar JavaScript spends ~9 ms on Wan's 2.1 M values (torch: ~5 ms in all); here
;; every step of a value is a 4-lane integer or float32 operation, ~3.5 ms in all (chromium
;; 156, measured by leaving parts out: the twist ~0.3 ms, log ~1.0, sin and cos ~1.3, the
;; tempering, uniforms and stores the rest). It is bound by the count of vector operations
;; (~110 per 8 values): unrolling the loop twice changed nothing.
;;
;; Memory (one 64 KiB page, owned by noise.js): bytes [0, 2496) are the engine's 624 words
;; (noise.js seeds them and reads them back for the tail); values are written from OUT = 4096
;; on, at most CHUNK_GROUPS (noise.js) groups of 16 per call, which noise.js copies out.
;;
;; Values are computed as torch computes them, in float32 step by step: u1 = 1 - u and
;; theta = 2pi_f32 * u2 rounded as torch rounds them, radius = sqrt(-2 log u1) with float32's
;; correctly rounded sqrt, the products r cos and r sin rounded once. Only log, cos and sin are
;; our own (torch uses Sleef's): Taylor series after an exact range reduction, accurate to
;; about one float32 ulp, which keeps every value within ~5e-7 of torch's.
(module
  (memory (export "memory") 1)

  ;; one scalar step of the twist: mt[p] = mt[src] ^ twisted(mt[p] upper bit | mt[next] lower 31)
  (func $step (param $p i32) (param $next i32) (param $src i32)
    (local $y i32)
    (local.set $y (i32.or (i32.and (i32.load (local.get $p)) (i32.const 0x80000000))
                          (i32.and (i32.load (local.get $next)) (i32.const 0x7fffffff))))
    (i32.store (local.get $p)
      (i32.xor (i32.xor (i32.load (local.get $src)) (i32.shr_u (local.get $y) (i32.const 1)))
               (i32.and (i32.sub (i32.const 0) (i32.and (local.get $y) (i32.const 1)))
                        (i32.const 0x9908b0df)))))

  ;; The next 624 words in place, four at a time: word kk takes the old kk + 1 and kk + 397
  ;; (kk < 227) or the new kk - 227 (kk >= 227); a 4-lane load of kk + 1 .. kk + 4 happens
  ;; before the store of kk .. kk + 3, so it still reads old words. 224..226 and 623 straddle
  ;; the wrap and go one at a time.
  (func $twist
    (local $p i32) (local $y v128)
    (local.set $p (i32.const 0))
    (loop $low
      (local.set $y (v128.bitselect (v128.load (local.get $p)) (v128.load offset=4 (local.get $p))
                                    (v128.const i32x4 0x80000000 0x80000000 0x80000000 0x80000000)))
      (v128.store (local.get $p)
        (v128.xor (v128.xor (v128.load offset=1588 (local.get $p))
                            (i32x4.shr_u (local.get $y) (i32.const 1)))
                  (v128.and (i32x4.shr_s (i32x4.shl (local.get $y) (i32.const 31)) (i32.const 31))
                            (v128.const i32x4 0x9908b0df 0x9908b0df 0x9908b0df 0x9908b0df))))
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (br_if $low (i32.lt_u (local.get $p) (i32.const 896))))
    (call $step (i32.const 896) (i32.const 900) (i32.const 2484))
    (call $step (i32.const 900) (i32.const 904) (i32.const 2488))
    (call $step (i32.const 904) (i32.const 908) (i32.const 2492))
    (local.set $p (i32.const 908))
    (loop $high
      (local.set $y (v128.bitselect (v128.load (local.get $p)) (v128.load offset=4 (local.get $p))
                                    (v128.const i32x4 0x80000000 0x80000000 0x80000000 0x80000000)))
      (v128.store (local.get $p)
        (v128.xor (v128.xor (v128.load (i32.sub (local.get $p) (i32.const 908)))
                            (i32x4.shr_u (local.get $y) (i32.const 1)))
                  (v128.and (i32x4.shr_s (i32x4.shl (local.get $y) (i32.const 31)) (i32.const 31))
                            (v128.const i32x4 0x9908b0df 0x9908b0df 0x9908b0df 0x9908b0df))))
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (br_if $high (i32.lt_u (local.get $p) (i32.const 2492))))
    (call $step (i32.const 2492) (i32.const 0) (i32.const 1584)))

  ;; groups * 16 values into OUT: twist, then each group of 16 words of the new state (whole
  ;; groups: 624 = 39 * 16) becomes 8 Box-Muller pairs. noise.js calls this with the engine
  ;; at a twist (all 624 words used).
  (func (export "fill") (param $groups i32)
    (local $p i32) (local $end i32) (local $delta i32) (local $n i32)
    (local $a v128) (local $b v128) (local $k v128) (local $f v128) (local $s v128)
    (local $z v128) (local $hfsq v128) (local $e v128) (local $log v128) (local $r v128)
    (local $t v128) (local $x v128) (local $x2 v128) (local $sin v128) (local $cos v128)
    (local $q v128) (local $swap v128)
    ;; Constants live in locals set once per call: a v128.const inside the loop is rebuilt at
    ;; each use (~8% slower measured), a local is a register or one stack load.
    (local $temper_b v128) (local $temper_c v128) (local $two24 v128) (local $low24 v128)
    (local $carry v128) (local $bias v128) (local $mantissa v128) (local $sqrt_half v128)
    (local $one v128) (local $two v128) (local $half v128) (local $minus2 v128)
    (local $l1 v128) (local $l2 v128) (local $l3 v128) (local $l4 v128)
    (local $ln2_hi v128) (local $ln2_lo v128) (local $angle v128) (local $two_over_pi v128)
    (local $pio2_1 v128) (local $pio2_2 v128) (local $pio2_3 v128)
    (local $s1 v128) (local $s2 v128) (local $s3 v128) (local $s4 v128)
    (local $c2 v128) (local $c3 v128) (local $c4 v128) (local $c5 v128)
    (local $i1 v128) (local $i2 v128)
    (local.set $temper_b (i32x4.splat (i32.const 0x9d2c5680)))  ;; MT19937's tempering masks
    (local.set $temper_c (i32x4.splat (i32.const 0xefc60000)))
    (local.set $two24 (i32x4.splat (i32.const 0x1000000)))
    (local.set $low24 (i32x4.splat (i32.const 0xffffff)))
    (local.set $carry (i32x4.splat (i32.const 0x004afb0d)))      ;; 1.0f's bits - sqrt(1/2)'s
    (local.set $bias (i32x4.splat (i32.const 151)))              ;; 127 + 24: gives e - 24
    (local.set $mantissa (i32x4.splat (i32.const 0x7fffff)))
    (local.set $sqrt_half (i32x4.splat (i32.const 0x3f3504f3)))  ;; float32 sqrt(1/2)'s bits
    (local.set $one (f32x4.splat (f32.const 1)))
    (local.set $two (f32x4.splat (f32.const 2)))
    (local.set $half (f32x4.splat (f32.const 0.5)))
    (local.set $minus2 (f32x4.splat (f32.const -2)))
    ;; 2/3, 2/5, 2/7, 2/9 (float32): log1p's series in s
    (local.set $l1 (f32x4.splat (f32.const 0x1.555556p-1)))
    (local.set $l2 (f32x4.splat (f32.const 0x1.99999ap-2)))
    (local.set $l3 (f32x4.splat (f32.const 0x1.24924ap-2)))
    (local.set $l4 (f32x4.splat (f32.const 0x1.c71c72p-3)))
    ;; ln 2 = ln2_hi + ln2_lo, ln2_hi to 16 bits (so 5-bit multiples of it are exact)
    (local.set $ln2_hi (f32x4.splat (f32.const 0x1.62e4p-1)))
    (local.set $ln2_lo (f32x4.splat (f32.const 0x1.7f7d1cp-20)))
    (local.set $angle (f32x4.splat (f32.const 0x1.921fb6p-22)))  ;; float32(2 pi) 2^-24, exact
    (local.set $two_over_pi (f32x4.splat (f32.const 0x1.45f306p-1)))
    ;; pi/2 = pio2_1 + pio2_2 + pio2_3 to 1e-17, the first two of 16 bits: q <= 4 times
    ;; either is exact
    (local.set $pio2_1 (f32x4.splat (f32.const 0x1.921fp+0)))
    (local.set $pio2_2 (f32x4.splat (f32.const 0x1.6a88p-17)))
    (local.set $pio2_3 (f32x4.splat (f32.const 0x1.0b46p-34)))
    ;; -1/3!, 1/5!, -1/7!, 1/9! and 1/4!, -1/6!, 1/8!, -1/10! (float32)
    (local.set $s1 (f32x4.splat (f32.const -0x1.555556p-3)))
    (local.set $s2 (f32x4.splat (f32.const 0x1.111112p-7)))
    (local.set $s3 (f32x4.splat (f32.const -0x1.a01a02p-13)))
    (local.set $s4 (f32x4.splat (f32.const 0x1.71de3ap-19)))
    (local.set $c2 (f32x4.splat (f32.const 0x1.555556p-5)))
    (local.set $c3 (f32x4.splat (f32.const -0x1.6c16c2p-10)))
    (local.set $c4 (f32x4.splat (f32.const 0x1.a01a02p-16)))
    (local.set $c5 (f32x4.splat (f32.const -0x1.27e4fcp-22)))
    (local.set $i1 (i32x4.splat (i32.const 1)))
    (local.set $i2 (i32x4.splat (i32.const 2)))
    (local.set $delta (i32.const 4096)) ;; OUT - the state's address, advanced per twist
    (loop $twists
      (call $twist)
      (local.set $n (local.get $groups))
      (if (i32.gt_u (local.get $n) (i32.const 39)) (then (local.set $n (i32.const 39))))
      (local.set $groups (i32.sub (local.get $groups) (local.get $n)))
      (local.set $end (i32.mul (local.get $n) (i32.const 64)))
      ;; p walks the first halves' quads of each group (bytes 0 and 16 of 64); each pairs with
      ;; the quad 32 bytes on: its words are u1's, those are u2's, the cosines go where the
      ;; first words were and the sines where the second were
      (local.set $p (i32.const 0))
      (loop $quads
        ;; tempering
        (local.set $a (v128.load (local.get $p)))
        (local.set $a (v128.xor (local.get $a) (i32x4.shr_u (local.get $a) (i32.const 11))))
        (local.set $a (v128.xor (local.get $a)
          (v128.and (i32x4.shl (local.get $a) (i32.const 7))
                    (local.get $temper_b))))
        (local.set $a (v128.xor (local.get $a)
          (v128.and (i32x4.shl (local.get $a) (i32.const 15))
                    (local.get $temper_c))))
        (local.set $a (v128.xor (local.get $a) (i32x4.shr_u (local.get $a) (i32.const 18))))
        (local.set $b (v128.load offset=32 (local.get $p)))
        (local.set $b (v128.xor (local.get $b) (i32x4.shr_u (local.get $b) (i32.const 11))))
        (local.set $b (v128.xor (local.get $b)
          (v128.and (i32x4.shl (local.get $b) (i32.const 7))
                    (local.get $temper_b))))
        (local.set $b (v128.xor (local.get $b)
          (v128.and (i32x4.shl (local.get $b) (i32.const 15))
                    (local.get $temper_c))))
        (local.set $b (v128.xor (local.get $b) (i32x4.shr_u (local.get $b) (i32.const 18))))

        ;; log u1, u1 = 1 - (a & 0xFFFFFF) 2^-24 = k 2^-24 with k = 2^24 - (a & 0xFFFFFF) in
        ;; [1, 2^24], exact in float32. k = 2^e m, m in [sqrt 1/2, sqrt 2) read off k's bits
        ;; (adding 0x004afb0d carries into the exponent exactly when the mantissa >= sqrt 2);
        ;; log u1 = (e - 24) ln 2 + log1p(f), f = m - 1 exact. log1p(f) = f - f^2/2 +
        ;; s (f^2/2 + R(s^2)), s = f / (2 + f), R(z) = z (2/3 + z (2/5 + z (2/7 + z 2/9))):
        ;; |s| < 0.172 so the series' next term is under 1e-9 of the result, and the big
        ;; terms (f, (e - 24) ln2_hi) are exact: about one ulp in all.
        (local.set $k (f32x4.convert_i32x4_s
          (i32x4.sub (local.get $two24)
                     (v128.and (local.get $a) (local.get $low24)))))
        (local.set $k (i32x4.add (local.get $k) (local.get $carry)))
        (local.set $e (f32x4.convert_i32x4_s
          (i32x4.sub (i32x4.shr_s (local.get $k) (i32.const 23))
                     (local.get $bias)))) ;; 127 + 24: e - 24
        (local.set $f (f32x4.sub
          (i32x4.add (v128.and (local.get $k) (local.get $mantissa))
                     (local.get $sqrt_half))
          (local.get $one)))
        (local.set $s (f32x4.div (local.get $f)
                                 (f32x4.add (local.get $f) (local.get $two))))
        (local.set $z (f32x4.mul (local.get $s) (local.get $s)))
        (local.set $hfsq (f32x4.mul (f32x4.mul (local.get $f) (local.get $f))
                                    (local.get $half)))
        (local.set $log
          (f32x4.add
            (f32x4.add
              (f32x4.sub
                (f32x4.add
                  (f32x4.mul (local.get $s)
                    (f32x4.add (local.get $hfsq)
                      (f32x4.mul (local.get $z)
                        (f32x4.add (local.get $l1)
                          (f32x4.mul (local.get $z)
                            (f32x4.add (local.get $l2)
                              (f32x4.mul (local.get $z)
                                (f32x4.add (local.get $l3)
                                  (f32x4.mul (local.get $z)
                                    (local.get $l4))))))))))
                  ;; (e - 24) ln2_lo; ln2_hi = ln 2 to 16 bits, so (e - 24) ln2_hi is exact
                  (f32x4.mul (local.get $e) (local.get $ln2_lo)))
                (local.get $hfsq))
              (local.get $f))
            (f32x4.mul (local.get $e) (local.get $ln2_hi))))
        (local.set $r (f32x4.sqrt (f32x4.mul (local.get $log) (local.get $minus2))))

        ;; theta = float32(2pi_f32 u2), u2 = (b & 0xFFFFFF) 2^-24: one rounding, as torch's
        ;; (2pi_f32 2^-24 is exact in float32). Then theta = q pi/2 + x, |x| <= pi/4, with
        ;; pi/2 in three parts of few bits (q <= 4: q part is exact, and so is theta - q part1
        ;; by Sterbenz), and Taylor series to x^9 (sin) and x^10 (cos): under 2e-9 off.
        (local.set $t (f32x4.mul
          (f32x4.convert_i32x4_s (v128.and (local.get $b) (local.get $low24)))
          (local.get $angle)))
        (local.set $q (f32x4.nearest (f32x4.mul (local.get $t)
          (local.get $two_over_pi))))
        (local.set $x (f32x4.sub (f32x4.sub (f32x4.sub (local.get $t)
            (f32x4.mul (local.get $q) (local.get $pio2_1)))
            (f32x4.mul (local.get $q) (local.get $pio2_2)))
            (f32x4.mul (local.get $q) (local.get $pio2_3))))
        (local.set $x2 (f32x4.mul (local.get $x) (local.get $x)))
        (local.set $sin (f32x4.add (local.get $x)
          (f32x4.mul (f32x4.mul (local.get $x) (local.get $x2))
            (f32x4.add (local.get $s1)
              (f32x4.mul (local.get $x2)
                (f32x4.add (local.get $s2)
                  (f32x4.mul (local.get $x2)
                    (f32x4.add (local.get $s3)
                      (f32x4.mul (local.get $x2)
                        (local.get $s4))))))))))
        (local.set $cos (f32x4.add
          (f32x4.sub (local.get $one)
                     (f32x4.mul (local.get $x2) (local.get $half)))
          (f32x4.mul (f32x4.mul (local.get $x2) (local.get $x2))
            (f32x4.add (local.get $c2)
              (f32x4.mul (local.get $x2)
                (f32x4.add (local.get $c3)
                  (f32x4.mul (local.get $x2)
                    (f32x4.add (local.get $c4)
                      (f32x4.mul (local.get $x2)
                        (local.get $c5))))))))))

        ;; the quadrant q: q odd swaps sin and cos; cos theta < 0 for q = 1, 2 and sin theta < 0
        ;; for q = 2, 3: those signs go onto the radius (a sign flip is exact)
        (local.set $q (i32x4.trunc_sat_f32x4_s (local.get $q)))
        (local.set $swap (i32x4.shr_s (i32x4.shl (local.get $q) (i32.const 31)) (i32.const 31)))
        (v128.store (i32.add (local.get $p) (local.get $delta))
          (f32x4.mul
            (v128.xor (local.get $r)
              (i32x4.shl (v128.and (i32x4.add (local.get $q) (local.get $i1))
                                   (local.get $i2))
                         (i32.const 30)))
            (v128.bitselect (local.get $sin) (local.get $cos) (local.get $swap))))
        (v128.store offset=32 (i32.add (local.get $p) (local.get $delta))
          (f32x4.mul
            (v128.xor (local.get $r)
              (i32x4.shl (v128.and (local.get $q) (local.get $i2)) (i32.const 30)))
            (v128.bitselect (local.get $cos) (local.get $sin) (local.get $swap))))

        ;; next quad: +16, then over the second halves (bytes 32..63 of each group)
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (local.set $p (i32.add (local.get $p) (i32.and (local.get $p) (i32.const 32))))
        (br_if $quads (i32.lt_u (local.get $p) (local.get $end))))
      (local.set $delta (i32.add (local.get $delta) (local.get $end)))
      (br_if $twists (local.get $groups))))
)
