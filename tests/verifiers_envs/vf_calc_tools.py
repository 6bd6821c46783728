"""The calculator toolset of vf_calc, in a module of its own: verifiers serves a toolset by running its module."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: float, b: float) -> float:
        """Add two numbers."""
        return a + b


if __name__ == "__main__":
    CalcToolset.run()
