"""Deployment: a trained model put to use.

:mod:`.inference` classifies images (classify.py, and the model an evaluation loads), :mod:`.split_accuracy`
scores them on a split in ImageFolder layout (top-1, top-5, the classes confused); :mod:`.export` writes
plain weights, ONNX graphs and AOTInductor packages (checkpoint2model.py, model2onnx.py); :mod:`.torch_export`
traces a model with torch.export, its batch free, and writes ONNX from it; :mod:`.aoti` compiles, proves and runs
.pt2 packages; :mod:`.onnx_runtime` runs a model in ONNX Runtime, exported once into a cache;
:mod:`.quantization` makes its int8 graph; :mod:`.triton_repository` writes a model of Triton's model
repository; :mod:`.tta` averages a model's logits over flipped copies of the images (classify.py's ``--tta``,
and validation's ``--val-tta``).

May import: data/, arguments/, models/, system/, records/, errors.  Used by train/ and the commands.
"""
