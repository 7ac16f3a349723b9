/* lmlab's CPU dropout in one pass per direction (loaded by lmlab.native, used by
 * lmlab.models.dropout). It draws exactly the masks of that module's NumPy path: the same
 * SFC64 stream (the generator state NumPy derives from the call's seed is passed in), 16 bits
 * per element in the order of a (native-endian) uint16 view of the 64-bit words, an element kept
 * where its bits are below the threshold; and it computes the same float32 values, x times the
 * rescale where kept, +0 or -0 where dropped (built with -ffp-contract=off: no fused
 * multiply-add, so the residual sum rounds as NumPy's separate add does).
 *
 * The random bits are made in blocks of BLOCK elements on the stack, so the rest of the work
 * is plain loops over arrays that the compiler vectorises. */
#include <stdint.h>
#include <string.h>

#define BLOCK 4096
_Static_assert(BLOCK % 4 == 0, "a block must use whole 64-bit words");

/* SFC64 (Chris Doty-Humphrey's small fast chaotic generator): state a, b, c and a counter. */
static inline uint64_t sfc64_next(uint64_t *state)
{
    uint64_t result = state[0] + state[1] + state[3];
    state[3] += 1;
    state[0] = state[1] ^ (state[1] >> 11);
    state[1] = state[2] + (state[2] << 3);
    state[2] = ((state[2] << 24) | (state[2] >> 40)) + result;
    return result;
}

static void draw_keep(const uint16_t *restrict bits, const float *restrict x, uint8_t *restrict keep,
                      int64_t m, uint32_t threshold, int relu)
{
    if (relu)
        for (int64_t i = 0; i < m; i++)
            keep[i] = (bits[i] < threshold) & (x[i] > 0.0f);
    else
        for (int64_t i = 0; i < m; i++)
            keep[i] = bits[i] < threshold;
}

static void rescale_kept(const float *restrict x, const uint8_t *restrict keep, float *restrict out,
                         int64_t m, float scale)
{
    for (int64_t i = 0; i < m; i++)
        out[i] = x[i] * (keep[i] ? scale : 0.0f);
}

static void rescale_kept_add(const float *restrict x, const uint8_t *restrict keep,
                             const float *restrict residual, float *restrict out, int64_t m, float scale)
{
    for (int64_t i = 0; i < m; i++) {
        float dropped = x[i] * (keep[i] ? scale : 0.0f);
        out[i] = dropped + residual[i];
    }
}

/* out = [residual +] x * keep * scale, keep drawn here (and ANDed with x > 0 when relu). */
void lmlab_dropout_forward(const float *x, const float *residual, float *out, uint8_t *keep, int64_t n,
                           uint64_t *state, uint32_t threshold, float scale, int relu)
{
    uint16_t bits[BLOCK];
    for (int64_t start = 0; start < n; start += BLOCK) {
        int64_t m = n - start < BLOCK ? n - start : BLOCK;
        for (int64_t w = 0; w < (m + 3) / 4; w++) {
            uint64_t word = sfc64_next(state);
            memcpy(bits + 4 * w, &word, sizeof word);
        }
        draw_keep(bits, x + start, keep + start, m, threshold, relu);
        if (residual)
            rescale_kept_add(x + start, keep + start, residual + start, out + start, m, scale);
        else
            rescale_kept(x + start, keep + start, out + start, m, scale);
    }
}

/* The gradient: grad * keep * scale. */
void lmlab_dropout_backward(const float *grad, const uint8_t *keep, float *out, int64_t n, float scale)
{
    rescale_kept(grad, keep, out, n, scale);
}
