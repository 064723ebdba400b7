// Teacher-forced top tokens of a GGUF model under llama.cpp: reads token ids
// (whitespace-separated) from stdin, decodes them as one sequence in one
// context with every position's logits kept, and prints the argmax of each
// position's logits (the prediction of the next token), one per line.
//
// Build against a llama.cpp build (tools/make_gemma3_refs.py does this):
//   cc -O2 tools/llama_cpp_argmax.c -I LLAMA_CPP/include -I LLAMA_CPP/ggml/include \
//      -L BUILD/bin -lllama -Wl,-rpath,BUILD/bin -o llama_cpp_argmax
// Usage: llama_cpp_argmax MODEL.gguf THREADS < ids.txt
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS < ids\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]);
    int cap = 1024, n = 0;
    llama_token *ids = malloc(sizeof(llama_token) * cap);
    int id;
    while (scanf("%d", &id) == 1) {
        if (n == cap) {
            cap *= 2;
            ids = realloc(ids, sizeof(llama_token) * cap);
        }
        ids[n++] = id;
    }
    if (n == 0) {
        fprintf(stderr, "no token ids on stdin\n");
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "%s: cannot load\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n;
    cp.n_batch = n;
    cp.n_ubatch = n;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context of %d tokens\n", n);
        return 1;
    }
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int i = 0; i < n; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        int best = 0;
        for (int t = 1; t < vocab; t++) {
            if (row[t] > row[best]) {
                best = t;
            }
        }
        printf("%d\n", best);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(ids);
    return 0;
}
