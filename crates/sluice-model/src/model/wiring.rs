//! How an architecture wires its decoder layer: where the RMSNorms sit
//! around each block, the MLP's activation, and whether the embedding is
//! scaled. The architecture chooses one ([`Arch::wiring`]); the shared
//! forward pass reads it, so a new wiring is a value here, not a new branch
//! in an architecture file.
//!
//! Promises: [`LayerWiring::default`] is the Llama / Qwen wiring (pre-norm,
//! SiLU, no embedding scale), and with it the forward pass runs exactly the
//! operations it ran before wirings existed.
//!
//! [`Arch::wiring`]: super::Arch::wiring

/// Where a layer's RMSNorms sit around its two blocks (attention, MLP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormPlacement {
    /// `x + block(norm(x))` (Llama, Qwen): `input_layernorm` before
    /// attention, `post_attention_layernorm` before the MLP.
    #[default]
    Pre,
    /// `x + post_norm(block(pre_norm(x)))` (Gemma 2 / 3): norms before and
    /// after each block — `input_layernorm` / `post_attention_layernorm`
    /// around attention, `pre_feedforward_layernorm` /
    /// `post_feedforward_layernorm` around the MLP.
    PrePost,
    /// `x + post_norm(block(x))` (OLMo 2): norms only after each block —
    /// `post_attention_layernorm` after attention,
    /// `post_feedforward_layernorm` after the MLP.
    Post,
}

/// The gated MLP's activation: `down(act(gate(x)) · up(x))`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(x)` (transformers' `silu`): SwiGLU.
    #[default]
    Silu,
    /// `0.5 · x · (1 + tanh(sqrt(2/π) · (x + 0.044715 · x³)))`
    /// (transformers' `gelu_pytorch_tanh`): GeGLU, as in Gemma.
    GeluTanh,
}

/// The wiring of every layer of one architecture.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerWiring {
    pub norms: NormPlacement,
    pub activation: Activation,
    /// The embedding rows are multiplied by this before the first layer
    /// (Gemma: `sqrt(hidden_size)`); `None` leaves them as read.
    pub embedding_scale: Option<f32>,
}
