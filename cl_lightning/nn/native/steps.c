/* One-point training steps of the slowly-changing-regression nets, a whole chunk of steps per call.
 *
 * The Python side (cl_lightning/nn/native/__init__.py) hands over the flat parameter, gradient and Adam-moment
 * tensors of cl_lightning.nn.optim.flat_adam.FlatAdam (each parameter a row-major view at an offset) and the chunk's data;
 * every step here predicts, takes the MSE gradient by hand and applies one Adam update, exactly the algorithm of
 * cl_lightning/nn/fused_steps.py, in float32 with sums in a fixed order (no reassociation: build without -ffast-math).
 * The rounding differs from torch's kernels (matrix products summed in another order), so the results agree with
 * the torch path to float32 rounding per step, not bit for bit.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"

/* ---- Each argument struct's layout (steps.h's field lists), exported for the Python side's check ---- */

/* A field's kind as the Python side names it: f float pointer, Q int64 pointer, P pointer to pointers, q int64,
 * d double (_Generic: from the declared type itself, so a field's type cannot change without the table seeing it). */
#define KIND(expr)                                                                                                   \
    _Generic((expr), float *: 'f', const float *: 'f', int64_t *: 'Q', const int64_t *: 'Q', float *const *: 'P',   \
             int64_t *const *: 'P', int64_t: 'q', double: 'd')
typedef struct {
    const char *name;
    int64_t offset, size, kind;
} field_layout;
typedef struct {
    int64_t size, count; /* sizeof the struct, its number of fields */
    const field_layout *fields;
} struct_layout;
#define DESCRIBE(type, name) {#name, offsetof(ARGS, name), sizeof(((ARGS *)0)->name), KIND(((ARGS *)0)->name)},
#define LAYOUT(kernel, fields)                                                                                       \
    static const field_layout kernel##_fields[] = {fields(DESCRIBE)};                                                \
    const struct_layout kernel##_layout = {sizeof(ARGS), sizeof(kernel##_fields) / sizeof(field_layout),            \
                                           kernel##_fields};
#define ARGS mlp_args
LAYOUT(mlp_mse_adam, MLP_FIELDS)
#undef ARGS
#define ARGS attention_args
LAYOUT(attention_mse_adam, ATTENTION_FIELDS)
#undef ARGS
#define ARGS gnt_args
LAYOUT(mlp_mse_adam_gnt, GNT_FIELDS)
#undef ARGS

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int decoupled; /* AdamW: decay the parameters, not the gradient */
} adam_hyper;

/* One Adam update of n elements from grad, step number `step` (torch.optim.Adam's single-tensor formulas). */
static void adam_update(float *p, float *g, float *m, float *v, int64_t n, const adam_hyper *h, double step) {
    const float w1 = (float)(1.0 - h->beta1), b2 = (float)h->beta2, w2 = (float)(1.0 - h->beta2);
    const float bc2_sqrt = (float)sqrt(1.0 - pow(h->beta2, step));
    const float step_size = (float)(h->lr / (1.0 - pow(h->beta1, step)));
    const float eps = (float)h->eps, wd = (float)h->weight_decay;
    const float decay = (float)(1.0 - h->lr * h->weight_decay);
    if (h->weight_decay != 0.0 && h->decoupled)
        for (int64_t i = 0; i < n; i++) p[i] *= decay;
    if (h->weight_decay != 0.0 && !h->decoupled)
        for (int64_t i = 0; i < n; i++) g[i] += wd * p[i]; /* the gradient buffer is rewritten every step */
    for (int64_t i = 0; i < n; i++) {
        m[i] += w1 * (g[i] - m[i]);
        v[i] = v[i] * b2 + w2 * g[i] * g[i];
        p[i] -= step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
    }
}

/* y (rows, out) = x (rows, in) @ W^T + b, W (out, in) row-major; relu when asked. */
static void linear(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t in, int64_t out,
                   int relu) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in;
        float *yr = y + r * out;
        for (int64_t o = 0; o < out; o++) {
            const float *wo = w + o * in;
            float acc = 0.0f;
            for (int64_t i = 0; i < in; i++) acc += xr[i] * wo[i];
            acc += b[o];
            yr[o] = relu && acc < 0.0f ? 0.0f : acc;
        }
    }
}

/* Gradients of y = x W^T + b from gy (rows, out): gW (out, in) = gyᵀ x, gb = Σ_rows gy; gx (rows, in) = gy W masked
 * by relu'(x) (x > 0) when gx is given. */
static void linear_backward(const float *x, const float *w, const float *gy, float *gw, float *gb, float *gx,
                            int64_t rows, int64_t in, int64_t out) {
    memset(gw, 0, sizeof(float) * out * in);
    memset(gb, 0, sizeof(float) * out);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in, *gr = gy + r * out;
        for (int64_t o = 0; o < out; o++) {
            const float go = gr[o];
            float *gwo = gw + o * in;
            for (int64_t i = 0; i < in; i++) gwo[i] += go * xr[i];
            gb[o] += go;
        }
    }
    if (!gx) return;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in, *gr = gy + r * out;
        float *gxr = gx + r * in;
        for (int64_t i = 0; i < in; i++) gxr[i] = 0.0f;
        for (int64_t o = 0; o < out; o++) {
            const float go = gr[o];
            const float *wo = w + o * in;
            for (int64_t i = 0; i < in; i++) gxr[i] += go * wo[i];
        }
        for (int64_t i = 0; i < in; i++)
            if (!(xr[i] > 0.0f)) gxr[i] = 0.0f;
    }
}

/* Scratch memory of the MLP kernels for `batch` points: a, every layer's input and the output; g and g_next, two
 * gradients of the widest layer (one allocation, freed through a). */
typedef struct {
    float *a, *g, *g_next;
} mlp_scratch;

static int mlp_scratch_alloc(mlp_scratch *s, int64_t layers, const int64_t *sizes, int64_t batch) {
    int64_t acts = 0, widest = 0;
    for (int64_t l = 0; l <= layers; l++) {
        acts += batch * sizes[l];
        if (sizes[l] > widest) widest = sizes[l];
    }
    s->a = malloc(sizeof(float) * (acts + 2 * batch * widest));
    if (!s->a) return -1;
    s->g = s->a + acts;
    s->g_next = s->g + batch * widest;
    return 0;
}

/* One step's prediction and MSE gradient of the MLP (ReLU between layers, linear output) on `batch` points x (B, D),
 * targets y (B, k): pred (B, k) and every layer's gradient into grad. Leaves every layer's input in a (a[0..B·D) = x,
 * then each hidden layer's post-ReLU features (B, H_l), then the output). */
static void mlp_mse_grad(const float *flat, float *grad, int64_t layers, const int64_t *sizes, const int64_t *w_off,
                         const int64_t *b_off, const float *x, const float *y, float *pred, int64_t batch,
                         const mlp_scratch *s) {
    const int64_t d = sizes[0], k = sizes[layers];
    float *h = s->a, *g = s->g, *g_next = s->g_next;
    memcpy(h, x, sizeof(float) * batch * d);
    for (int64_t l = 0; l < layers; l++) {
        float *next = h + batch * sizes[l];
        linear(h, flat + w_off[l], flat + b_off[l], next, batch, sizes[l], sizes[l + 1], l + 1 < layers);
        h = next;
    }
    const float scale = 2.0f / (float)(batch * k);
    for (int64_t i = 0; i < batch * k; i++) {
        pred[i] = h[i];
        g[i] = scale * (h[i] - y[i]);
    }
    for (int64_t l = layers - 1; l >= 0; l--) {
        h -= batch * sizes[l];
        linear_backward(h, flat + w_off[l], g, grad + w_off[l], grad + b_off[l], l ? g_next : NULL, batch, sizes[l],
                        sizes[l + 1]);
        float *swap = g;
        g = g_next;
        g_next = swap;
    }
}

/* MLP (ReLU between layers, linear output) on T chunks of B points: predict chunk t (preds, (T, B, k)), then one
 * Adam step on its MSE. Layer l: weight (sizes[l+1], sizes[l]) at flat + w_off[l], bias at flat + b_off[l]; the
 * same offsets index grad, exp_avg and exp_avg_sq. Returns 0, or -1 when scratch memory cannot be had. */
int mlp_mse_adam(const mlp_args *a) {
    float *flat = a->flat, *grad = a->grad, *preds = a->preds;
    const int64_t layers = a->layers, *sizes = a->sizes, *w_off = a->w_off, *b_off = a->b_off, batch = a->batch;
    const adam_hyper hyper = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, (int)a->decoupled};
    mlp_scratch scratch;
    if (mlp_scratch_alloc(&scratch, layers, sizes, batch)) return -1;
    const int64_t d = sizes[0], k = sizes[layers];
    for (int64_t t = 0; t < a->steps; t++) {
        mlp_mse_grad(flat, grad, layers, sizes, w_off, b_off, a->xs + t * batch * d, a->ys + t * batch * k,
                     preds + t * batch * k, batch, &scratch);
        adam_update(flat, grad, a->exp_avg, a->exp_avg_sq, a->numel, &hyper, a->first_step + (double)t);
    }
    free(scratch.a);
    return 0;
}

/* ---- Continual Backprop: AdamGnT and generate-and-test's test (cl_lightning/nn/optim/adam_gnt.py, nn/gnt.py) ---- */

/* base^t for float32 t (powf), remembering the last exponent: the ages of a layer's units are equal but for the
 * units replaced lately, so pow runs about once per run of equal ages, not once per unit. */
typedef struct {
    float base, t, value;
} pow_memo;

static inline float pow_at(pow_memo *memo, float t) {
    if (t != memo->t) {
        memo->t = t;
        memo->value = powf(memo->base, t);
    }
    return memo->value;
}

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, one_minus_beta1, one_minus_beta2;
    int reference; /* the reference snapshot's update rule, else "corrected" */
} adam_gnt_hyper;

/* One AdamGnT update of n elements (AdamGnT.step / FlatAdamGnT.update, in float32 as torch computes them), each
 * element with its own step count t:
 *   g ← g + λ·p (coupled L2 on a copy of the gradient), t ← t + 1, m ← β1·m + (1−β1)·g, v ← β2·v + (1−β2)·g²;
 *   "corrected": p ← p − lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + ε) (standard Adam with a per-element t);
 *   "reference": p ← p − lr · (1−β2^t) / ((√v + ε) / m) (the authors' snapshot: the step-size correction computed
 *   but not assigned, the denominator divided in place by m; shibhansh/loss-of-plasticity#12).
 * The counts are equal over long runs of elements (only replaced units' rows and columns restarted), so β^t is taken
 * once per run and the loops over a run vectorise (+ − × ÷ √ round alike in vector and scalar code). */
static void adam_gnt_update(float *p, const float *grad, float *t, float *m, float *v, int64_t n,
                            const adam_gnt_hyper *h) {
    for (int64_t i = 0; i < n; i++) {
        const float g = h->weight_decay != 0.0f ? grad[i] + h->weight_decay * p[i] : grad[i];
        t[i] += 1.0f;
        m[i] = m[i] * h->beta1 + h->one_minus_beta1 * g;
        v[i] = v[i] * h->beta2 + h->one_minus_beta2 * g * g;
    }
    for (int64_t start = 0, stop; start < n; start = stop) {
        const float count = t[start];
        for (stop = start + 1; stop < n && t[stop] == count;) stop++;
        const float one_minus_beta1_t = 1.0f - powf(h->beta1, count);
        const float one_minus_beta2_t = 1.0f - powf(h->beta2, count);
        if (h->reference)
            for (int64_t i = start; i < stop; i++)
                p[i] += -h->lr * (one_minus_beta2_t / ((sqrtf(v[i]) + h->eps) / m[i]));
        else
            for (int64_t i = start; i < stop; i++)
                p[i] += -h->lr * ((m[i] / one_minus_beta1_t) / (sqrtf(v[i] / one_minus_beta2_t) + h->eps));
    }
}

typedef struct {
    float eta, one_minus_eta;
    int adaptable; /* "adaptable_contribution", else "contribution" */
} gnt_hyper;

/* Generate-and-test's test of one hidden layer (GenerateAndTest._test; Dohare et al. 2024, lop/algos/gnt.py
 * test_features) after the step's update: h (B, H) the layer's post-ReLU features from the forward pass before the
 * update, w (H, in) its weight and w_next (out, H) its consumer's, both updated. Per unit, with η the decay rate:
 *   age += 1, bc = 1 − η^age (Adam-style bias correction), util ← η·util,
 *   mean_act ← η·mean_act + (1−η)·mean_B(h), ĥ = mean_act / bc,
 *   out_mag = mean |w_next[:, u]|, in_mag = mean |w[u, :]|,
 *   new = out_mag · mean_B|h − ĥ| / in_mag ("adaptable_contribution") or out_mag · mean_B|h| ("contribution"),
 *   util ← util + (1−η)·new, bias_corrected_util = util / bc.
 * Which units to replace is decided in Python (GenerateAndTest.replace), from these buffers. */
static void gnt_test(const float *hid, int64_t batch, int64_t width, const float *w, int64_t in, const float *w_next,
                     int64_t out, float *util, float *bc_util, float *mean_act, int64_t *age, const gnt_hyper *gh) {
    pow_memo eta_age = {gh->eta, -1.0f, 0.0f};
    for (int64_t u = 0; u < width; u++) {
        age[u] += 1;
        const float bc = 1.0f - pow_at(&eta_age, (float)age[u]);
        util[u] *= gh->eta;
        float sum = 0.0f;
        for (int64_t b = 0; b < batch; b++) sum += hid[b * width + u];
        mean_act[u] = mean_act[u] * gh->eta + gh->one_minus_eta * (sum / (float)batch);
        const float h_hat = mean_act[u] / bc;
        float out_sum = 0.0f, in_sum = 0.0f;
        for (int64_t o = 0; o < out; o++) out_sum += fabsf(w_next[o * width + u]);
        for (int64_t i = 0; i < in; i++) in_sum += fabsf(w[u * in + i]);
        const float out_mag = out_sum / (float)out, in_mag = in_sum / (float)in;
        float dev = 0.0f, fresh;
        if (gh->adaptable) {
            for (int64_t b = 0; b < batch; b++) dev += fabsf(hid[b * width + u] - h_hat);
            fresh = out_mag * (dev / (float)batch) / in_mag;
        } else {
            for (int64_t b = 0; b < batch; b++) dev += fabsf(hid[b * width + u]);
            fresh = out_mag * (dev / (float)batch);
        }
        util[u] += gh->one_minus_eta * fresh;
        bc_util[u] = util[u] / bc;
    }
}

/* Continual Backprop's fused steps (ContinualBackprop.learn_fused on the torch path) between two replacements: per
 * chunk t of B points, predict (preds (T, B, k)), the MSE gradient, one AdamGnT update on the flat tensors (step
 * counts in element_step), then, when `test`, generate-and-test's test of every hidden layer l into its buffers
 * util[l], bc_util[l], mean_act[l] (float32) and age[l] (int64). The caller stops the kernel after a step at which
 * some layer replaces units and replaces them itself. Layout as mlp_mse_adam. Returns 0, or -1 without memory. */
int mlp_mse_adam_gnt(const gnt_args *a) {
    float *flat = a->flat, *grad = a->grad, *preds = a->preds;
    const int64_t layers = a->layers, *sizes = a->sizes, *w_off = a->w_off, *b_off = a->b_off, batch = a->batch;
    const double lr = a->lr, beta1 = a->beta1, beta2 = a->beta2, decay_rate = a->decay_rate;
    /* the constants as torch casts them: Python floats (doubles) to float32, the weights 1 − β and 1 − η (the
     * operations' alpha / value) computed in double first */
    const adam_gnt_hyper hyper = {
        .lr = (float)lr, .beta1 = (float)beta1, .beta2 = (float)beta2, .eps = (float)a->eps,
        .weight_decay = (float)a->weight_decay, .one_minus_beta1 = (float)(1.0 - beta1),
        .one_minus_beta2 = (float)(1.0 - beta2), .reference = (int)a->reference,
    };
    const gnt_hyper gh = {
        .eta = (float)decay_rate, .one_minus_eta = (float)(1.0 - decay_rate), .adaptable = (int)a->adaptable,
    };
    mlp_scratch scratch;
    if (mlp_scratch_alloc(&scratch, layers, sizes, batch)) return -1;
    const int64_t d = sizes[0], k = sizes[layers];
    for (int64_t t = 0; t < a->steps; t++) {
        mlp_mse_grad(flat, grad, layers, sizes, w_off, b_off, a->xs + t * batch * d, a->ys + t * batch * k,
                     preds + t * batch * k, batch, &scratch);
        adam_gnt_update(flat, grad, a->element_step, a->exp_avg, a->exp_avg_sq, a->numel, &hyper);
        if (!a->test) continue; /* replacement rate 0: the reference returns before testing */
        const float *hid = scratch.a + batch * d; /* layer 1's input: the first hidden layer's features */
        for (int64_t l = 0; l + 1 < layers; l++) {
            gnt_test(hid, batch, sizes[l + 1], flat + w_off[l], sizes[l], flat + w_off[l + 1], sizes[l + 2],
                     a->util[l], a->bc_util[l], a->mean_act[l], a->age[l], &gh);
            hid += batch * sizes[l + 1];
        }
    }
    free(scratch.a);
    return 0;
}

/* Label-free query-only attention along a window of the stream (cl_lightning.nn.fused_steps.attention_mse_steps):
 * step t's query is window point S + t, its supports the S points before it. Scorer: first layer weight
 * (H0, 2D) = [W_s | W_q] on [x_j, x_t], bias H0; then `layers` linear layers (ReLU after each but the last, whose
 * width is 1): scores s_j, p = softmax(s), pred = Σ_j p_j y_j (k outputs), loss mean((pred − y_t)²). sizes: H0, then
 * each later layer's width (the last 1). Returns 0, or -1 when scratch memory cannot be had. */
static inline __attribute__((always_inline)) int attention_impl(const attention_args *args, int64_t d, int64_t k,
                                                                int64_t h0) {
    float *flat = args->flat, *grad = args->grad, *preds = args->preds;
    const int64_t layers = args->layers, *sizes = args->sizes, *w_off = args->w_off, *b_off = args->b_off;
    const float *window_x = args->window_x, *window_y = args->window_y;
    const adam_hyper hyper = {args->lr, args->beta1, args->beta2, args->eps, args->weight_decay, (int)args->decoupled};
    const int64_t s = args->support; /* d, k, h0 (sizes[0]): constants where the caller made them so */
    int64_t acts = 0, widest = 0;
    for (int64_t l = 0; l <= layers; l++) {
        acts += s * sizes[l];
        if (sizes[l] > widest) widest = sizes[l];
    }
    float *a = malloc(sizeof(float) * (acts + 2 * s * widest + h0 + 2 * s + k + d * h0));
    if (!a) return -1;
    float *g = a + acts, *g_next = g + s * widest, *query_part = g_next + s * widest, *p = query_part + h0;
    float *g_score = p + s, *g_pred = g_score + s, *ws_t = g_pred + k;
    const float *w0 = flat + w_off[0], *b0 = flat + b_off[0];
    float *gw0 = grad + w_off[0], *gb0 = grad + b_off[0];
    for (int64_t t = 0; t < args->steps; t++) {
        const float *sx = window_x + t * d, *sy = window_y + t * k;
        const float *qx = window_x + (s + t) * d, *qy = window_y + (s + t) * k;
        for (int64_t o = 0; o < h0; o++) { /* W_q x_t + b: shared by every support */
            const float *wq = w0 + o * 2 * d + d;
            float acc = 0.0f;
            for (int64_t i = 0; i < d; i++) acc += qx[i] * wq[i];
            query_part[o] = acc + b0[o];
        }
        for (int64_t o = 0; o < h0; o++) /* W_s transposed, (D, H0): the loops below run along a row of it */
            for (int64_t i = 0; i < d; i++) ws_t[i * h0 + o] = w0[o * 2 * d + i];
        float *hid = a; /* (S, H0): relu(W_s x_j + W_q x_t + b), each sum over i in order */
        for (int64_t j = 0; j < s; j++) {
            const float *xj = sx + j * d;
            float *hj = hid + j * h0;
            for (int64_t o = 0; o < h0; o++) hj[o] = 0.0f;
            for (int64_t i = 0; i < d; i++) {
                const float xi = xj[i];
                const float *wi = ws_t + i * h0;
                for (int64_t o = 0; o < h0; o++) hj[o] += xi * wi[o];
            }
            for (int64_t o = 0; o < h0; o++) {
                const float v = hj[o] + query_part[o];
                hj[o] = v < 0.0f ? 0.0f : v;
            }
        }
        float *x = hid;
        for (int64_t l = 1; l <= layers; l++) {
            float *next = x + s * sizes[l - 1];
            linear(x, flat + w_off[l], flat + b_off[l], next, s, sizes[l - 1], sizes[l], l < layers);
            x = next;
        }
        float top = x[0]; /* softmax over the S scores */
        for (int64_t j = 1; j < s; j++)
            if (x[j] > top) top = x[j];
        float total = 0.0f;
        for (int64_t j = 0; j < s; j++) total += p[j] = expf(x[j] - top);
        for (int64_t j = 0; j < s; j++) p[j] /= total;
        float *pred = preds + t * k;
        for (int64_t c = 0; c < k; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < s; j++) acc += p[j] * sy[j * k + c];
            pred[c] = acc;
            g_pred[c] = 2.0f / (float)k * (acc - qy[c]);
        }
        float dot = 0.0f; /* softmax backward: g_s_j = p_j (g_p_j − Σ_i p_i g_p_i), g_p_j = g_pred · y_j */
        for (int64_t j = 0; j < s; j++) {
            float gp = 0.0f;
            for (int64_t c = 0; c < k; c++) gp += g_pred[c] * sy[j * k + c];
            g_score[j] = gp;
            dot += p[j] * gp;
        }
        for (int64_t j = 0; j < s; j++) g[j] = p[j] * (g_score[j] - dot);
        for (int64_t l = layers; l >= 1; l--) {
            x -= s * sizes[l - 1];
            linear_backward(x, flat + w_off[l], g, grad + w_off[l], grad + b_off[l], g_next, s, sizes[l - 1],
                            sizes[l]);
            float *swap = g;
            g = g_next;
            g_next = swap;
        }
        /* first layer: ∂W_s = gᵀ x_S, ∂b = Σ_S g, ∂W_q = (Σ_S g) ⊗ x_t */
        memset(gb0, 0, sizeof(float) * h0);
        for (int64_t o = 0; o < h0; o++) memset(gw0 + o * 2 * d, 0, sizeof(float) * d);
        for (int64_t j = 0; j < s; j++) {
            const float *xj = sx + j * d;
            for (int64_t o = 0; o < h0; o++) {
                const float go = g[j * h0 + o];
                float *gws = gw0 + o * 2 * d;
                for (int64_t i = 0; i < d; i++) gws[i] += go * xj[i];
                gb0[o] += go;
            }
        }
        for (int64_t o = 0; o < h0; o++)
            for (int64_t i = 0; i < d; i++) gw0[o * 2 * d + d + i] = gb0[o] * qx[i];
        adam_update(flat, grad, args->exp_avg, args->exp_avg_sq, args->numel, &hyper, args->first_step + (double)t);
    }
    free(a);
    return 0;
}

/* The exported kernel: attention_impl, generic, or, when the library is built for one shape (-DATTENTION_D=…
 * -DATTENTION_H0=… -DATTENTION_K=…: nn/native builds one per shape it is called with), with that shape's widths as
 * constants for calls of that shape, so the compiler unrolls the short inner loops (the same operations in the same
 * order: the same numbers). */
int attention_mse_adam(const attention_args *a) {
#if defined(ATTENTION_D) && defined(ATTENTION_H0) && defined(ATTENTION_K)
    if (a->d == ATTENTION_D && a->sizes[0] == ATTENTION_H0 && a->k == ATTENTION_K)
        return attention_impl(a, ATTENTION_D, ATTENTION_K, ATTENTION_H0);
#endif
    return attention_impl(a, a->d, a->k, a->sizes[0]);
}
