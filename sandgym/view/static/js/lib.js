// The one place the vendored libraries are imported from.
export { html, render, useState, useEffect, useRef, useMemo, useCallback } from "../vendor/preact-htm.min.js";
