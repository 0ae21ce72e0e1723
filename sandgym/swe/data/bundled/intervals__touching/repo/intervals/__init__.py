from .merge import merge
