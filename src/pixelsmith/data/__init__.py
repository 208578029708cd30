"""Data modules: the embedded MNIST default, image folders for users' own data, and resumable samplers."""
