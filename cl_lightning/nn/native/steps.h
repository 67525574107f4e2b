/* The native step kernels' interface (steps.c): one argument struct per kernel, each field listed once (X-macros).
 *
 * steps.c exports each struct's layout as <kernel>_layout (name, offset, size and kind of every field);
 * cl_lightning/nn/native/__init__.py mirrors each struct as a ctypes.Structure and, on loading the library, compares
 * the two field by field, so a struct changed on one side only fails loudly, not as memory corruption. Shapes, step
 * numbers and hyper-parameters are all fields: nothing is specific to one net. Valid C and C++ (a C++ caller, e.g.
 * benchmarks/native_interface.py's torch extension, includes this header).
 */
#ifndef CL_LIGHTNING_NATIVE_STEPS_H
#define CL_LIGHTNING_NATIVE_STEPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The flat tensors of FlatAdam / FlatAdamGnT and the net's layout in them: layer l's weight (sizes[l+1], sizes[l])
 * at flat + w_off[l], its bias at flat + b_off[l]; the same offsets index grad, exp_avg and exp_avg_sq. */
#define NET_FIELDS(X)                                                                                                \
    X(float *, flat) X(float *, grad) X(float *, exp_avg) X(float *, exp_avg_sq) X(int64_t, numel)                  \
    X(int64_t, layers) X(const int64_t *, sizes) X(const int64_t *, w_off) X(const int64_t *, b_off)
/* Adam / AdamW: the chunk's first step number, the hyper-parameters, decoupled (AdamW) weight decay or not */
#define ADAM_FIELDS(X)                                                                                               \
    X(double, first_step) X(double, lr) X(double, beta1) X(double, beta2) X(double, eps) X(double, weight_decay)     \
    X(int64_t, decoupled)
/* the MLP: `steps` chunks of `batch` points, xs (T, B, D), ys and preds (T, B, k) */
#define MLP_FIELDS(X)                                                                                                \
    NET_FIELDS(X) ADAM_FIELDS(X)                                                                                     \
    X(const float *, xs) X(const float *, ys) X(float *, preds) X(int64_t, steps) X(int64_t, batch)
/* query-only attention along a window: window_x (S + T, d), window_y (S + T, k), preds (T, k) */
#define ATTENTION_FIELDS(X)                                                                                          \
    NET_FIELDS(X) ADAM_FIELDS(X)                                                                                     \
    X(const float *, window_x) X(const float *, window_y) X(int64_t, d) X(int64_t, k) X(int64_t, support)            \
    X(float *, preds) X(int64_t, steps)
/* Continual Backprop: the MLP's data, AdamGnT (per-element step counts, the update rule) and generate-and-test's
 * test (decay rate, utility, each hidden layer's buffers) */
#define GNT_FIELDS(X)                                                                                                \
    NET_FIELDS(X) X(float *, element_step)                                                                           \
    X(const float *, xs) X(const float *, ys) X(float *, preds) X(int64_t, steps) X(int64_t, batch)                  \
    X(double, lr) X(double, beta1) X(double, beta2) X(double, eps) X(double, weight_decay) X(int64_t, reference)    \
    X(int64_t, test) X(double, decay_rate) X(int64_t, adaptable)                                                     \
    X(float *const *, util) X(float *const *, bc_util) X(float *const *, mean_act) X(int64_t *const *, age)

#define DECLARE(type, name) type name;
typedef struct { MLP_FIELDS(DECLARE) } mlp_args;
typedef struct { ATTENTION_FIELDS(DECLARE) } attention_args;
typedef struct { GNT_FIELDS(DECLARE) } gnt_args;

/* Each kernel returns 0, or -1 when its scratch memory cannot be had. */
int mlp_mse_adam(const mlp_args *a);
int attention_mse_adam(const attention_args *a);
int mlp_mse_adam_gnt(const gnt_args *a);

#ifdef __cplusplus
}
#endif

#endif
