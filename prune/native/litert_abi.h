/* Hand-written declarations of the stable TFLite C ABI that prune's LiteRT delegate uses.
 *
 * TFLite's headers are not in the TensorFlow or ai-edge-litert wheels, so the structs below are declared here,
 * from upstream's tensorflow/lite/core/c/common.h (LiteRT: tflite/core/c/common.h), for a non-Windows build
 * without TF_LITE_STATIC_MEMORY. Only the members used need to be right, but the order and size of every member
 * before them must match upstream. No TFLite symbol is linked: everything goes through the function pointers of
 * TfLiteContext. Checked member by member against google-ai-edge/LiteRT's tflite/core/c/common.h at commit
 * 01d971c556e3 (a feasibility probe found LiteRT v2.2.0's layouts identical), and run with ai-edge-litert 2.3.0 and
 * tensorflow 2.21.0's tf.lite (tests/prune/deploy/test_litert_kernels.py is the canary). Upstream promises that
 * members are only appended to these structs ("semi-ABI stable").
 */
#ifndef PRUNE_LITERT_ABI_H_
#define PRUNE_LITERT_ABI_H_
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { kTfLiteOk = 0, kTfLiteError = 1 } TfLiteStatus;
typedef int TfLiteType;
enum { kTfLiteFloat32 = 1, kTfLiteInt32 = 2 };                  /* TfLiteType */
enum { kTfLiteMmapRo = 1 };                                     /* TfLiteAllocationType: constant, from the model */
enum { kTfLiteBuiltinCustom = 32 };                             /* TfLiteBuiltinOperator */
enum { kTfLiteOptionalTensor = -1 };
enum { kTfLiteDelegateFlagsAllowDynamicTensors = 1 };

typedef struct TfLiteIntArray {
  int size;
  int data[];
} TfLiteIntArray;
typedef struct {
  float scale;
  int32_t zero_point;
} TfLiteQuantizationParams;
typedef struct {
  int type;
  void* params;
} TfLiteQuantization;
struct TfLiteDelegate;

typedef struct TfLiteTensor {
  TfLiteType type;
  union {
    float* f;
    int32_t* i32;
    void* data;
  } data;
  TfLiteIntArray* dims;
  TfLiteQuantizationParams params;
  int allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  struct TfLiteDelegate* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  TfLiteQuantization quantization;
  void* sparsity;
  const TfLiteIntArray* dims_signature;
} TfLiteTensor;

typedef struct TfLiteNode {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  TfLiteIntArray* intermediates;
  TfLiteIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  struct TfLiteDelegate* delegate;
  bool might_have_side_effect;
} TfLiteNode;

struct TfLiteRegistration;
typedef struct TfLiteContext {
  size_t tensors_size;
  TfLiteStatus (*GetExecutionPlan)(struct TfLiteContext*, TfLiteIntArray**);
  TfLiteTensor* tensors;
  void* impl_;
  TfLiteStatus (*ResizeTensor)(struct TfLiteContext*, TfLiteTensor*, TfLiteIntArray*);  /* takes the array */
  void (*ReportError)(struct TfLiteContext*, const char* msg, ...);
  TfLiteStatus (*AddTensors)(struct TfLiteContext*, int, int*);
  TfLiteStatus (*GetNodeAndRegistration)(struct TfLiteContext*, int, TfLiteNode**, struct TfLiteRegistration**);
  TfLiteStatus (*ReplaceNodeSubsetsWithDelegateKernels)(struct TfLiteContext*, struct TfLiteRegistration,
                                                        const TfLiteIntArray*, struct TfLiteDelegate*);
  /* further members not used */
} TfLiteContext;

typedef struct TfLiteRegistration {
  void* (*init)(TfLiteContext*, const char* buffer, size_t length);
  void (*free)(TfLiteContext*, void* buffer);
  TfLiteStatus (*prepare)(TfLiteContext*, TfLiteNode*);
  TfLiteStatus (*invoke)(TfLiteContext*, TfLiteNode*);
  const char* (*profiling_string)(const TfLiteContext*, const TfLiteNode*);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external; /* TfLiteOperator*: NULL for a classic kernel */
  void* (*async_kernel)(TfLiteContext*, TfLiteNode*);
  uint64_t inplace_operator;
} TfLiteRegistration;

typedef struct TfLiteDelegateParams {
  struct TfLiteDelegate* delegate;
  TfLiteIntArray* nodes_to_replace;
  TfLiteIntArray* input_tensors;
  TfLiteIntArray* output_tensors;
} TfLiteDelegateParams;

typedef struct TfLiteDelegate {
  void* data_;
  TfLiteStatus (*Prepare)(TfLiteContext*, struct TfLiteDelegate*);
  TfLiteStatus (*CopyFromBufferHandle)(TfLiteContext*, struct TfLiteDelegate*, int, TfLiteTensor*);
  TfLiteStatus (*CopyToBufferHandle)(TfLiteContext*, struct TfLiteDelegate*, int, TfLiteTensor*);
  void (*FreeBufferHandle)(TfLiteContext*, struct TfLiteDelegate*, int*);
  int64_t flags;
  void* opaque_delegate_builder; /* NULL for a classic delegate */
} TfLiteDelegate;

#ifdef __cplusplus
}
#endif
#endif /* PRUNE_LITERT_ABI_H_ */
